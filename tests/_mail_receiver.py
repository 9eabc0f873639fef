"""A receiver for tests/test_mail_crash.py, run as its own process: it receives from one
mailbox until nothing more is free, acknowledges the messages whose body says `"ack": true`,
and reports each step on stdout as a JSON line, an ack only once it has returned (so it is
committed). Then it prints `ready` and holds its leases until it is killed.

Usage: python _mail_receiver.py TARGET SCHEMA VISIBILITY_S  (SCHEMA "-" for none)
"""

from __future__ import annotations

import asyncio
import json
import sys

from agents import Address, PostOffice
from memory import SQLMailStore, SQLStore

READER = Address("acme", "wf-1", "reader")


def say(line: object) -> None:
    print(json.dumps(line), flush=True)


async def main(target: str, schema: str | None, visibility_s: float) -> None:
    async with SQLStore(target, schema=schema) as store:
        office = PostOffice(SQLMailStore(store))
        for _ in range(10):  # a few rounds do it; a store that never runs dry must not hang
            got = await office.receive(READER, limit=4, visibility_s=visibility_s, wait_s=0)
            if not got:
                break
            for d in got:
                say({"got": [d.id.sender.agent, d.id.seq], "attempt": d.attempt})
            done = [d for d in got if d.body["ack"]]
            await office.ack(*done)
            for d in done:
                say({"acked": [d.id.sender.agent, d.id.seq]})
        say("ready")
        await asyncio.Event().wait()  # holding what it leased, until SIGKILL


if __name__ == "__main__":
    target, schema, visibility = sys.argv[1:4]
    asyncio.run(main(target, None if schema == "-" else schema, float(visibility)))
