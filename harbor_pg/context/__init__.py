"""Per-turn context: window trimming, rolling summary, query rewrite, prompts, token counting."""
