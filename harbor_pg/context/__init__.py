"""Per-turn context: window trimming, rolling summary, query rewrite and its prompts, recall."""
