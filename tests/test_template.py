"""Prompt templates: references, escapes, filling in two steps, and clear errors."""

from __future__ import annotations

import pydantic
import pytest

from orchestrator import Template, UsageError


class Verdict(pydantic.BaseModel):
    ok: bool


def test_references_are_found_once_in_order_and_filled() -> None:
    t = Template("Compare ${a} with ${b}; again ${a}. Costs $5, $${literal}.")
    assert t.names == ("a", "b")
    text = t.render({"a": "x", "b": {"n": [1, 2]}})
    assert text == 'Compare x with {"n": [1, 2]}; again x. Costs $5, ${literal}.'


def test_structured_answers_read_as_their_json() -> None:
    assert Template("${v}").render({"v": Verdict(ok=True)}) == '{"ok":true}'


def test_fill_now_leaves_the_rest_and_adds_no_references() -> None:
    t = Template("Topic ${inputs.topic}, found ${search}")
    filled = t.fill({"inputs.topic": "a ${trap} here"})
    assert filled.names == ("search",)
    assert filled.render({"search": "S"}) == "Topic a ${trap} here, found S"


@pytest.mark.parametrize(
    ("text", "says"),
    [("open ${never", "not closed"), ("empty ${}", "names nothing"), ("blank ${  }", "nothing")],
)
def test_a_malformed_template_is_refused_with_where(text: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        Template(text)


def test_a_reference_without_an_input_names_it_and_what_there_is() -> None:
    with pytest.raises(UsageError, match=r"\$\{gone\}.*\('here'\)"):
        Template("${gone}").render({"here": 1})


def test_not_text_is_refused() -> None:
    with pytest.raises(UsageError, match="takes text"):
        Template(3)  # type: ignore[arg-type]
