"""Trial records: the schema, the JSONL store, the frame's columns, and the one reader."""
