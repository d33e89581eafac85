"""Training data: sources, tokenizer, document lengths, packing and the grain pipeline.

Modules: tokenizer (byte-level ids and special ids), lengths (document-length distributions),
documents (the document record and its makers), sources (Wikipedia text and synthetic tasks),
jsonl (local conversation files), packing (documents -> aligned rows), batching (step batches
balanced across shards), synthetic (long-context retrieval tasks), pipeline (grain datasets and
the training iterator). Import from the modules; this package imports nothing so that
`batching` can use `packing` without a cycle.
"""
