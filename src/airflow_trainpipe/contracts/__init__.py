"""What crosses a task, a process or a file: typed, validated on read, light.

manifest (a snapshot's files and lineage), payloads (what one task hands the next), train_spec
(launcher -> training entrypoint), events (the job's stdout lines), artifacts (what a run leaves
on MLflow, by name). pydantic and the config only: parse time, workers and pods all import them.
"""
