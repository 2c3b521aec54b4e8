"""The three tiers: short-term turns, working scratch state, long-term memories."""
