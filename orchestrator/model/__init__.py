"""What a workflow is: tasks, their DAG, events, errors, the LLM protocol and clocks."""
