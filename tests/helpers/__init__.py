"""What the tests share that is not a fixture: server commands and tiny models on disk."""
