"""Long-term extraction: the model-facing fact schema, the secret filter, entity resolution."""
