"""The engine: runs workflows on one loop, calls backends, keeps runs durable with a store."""
