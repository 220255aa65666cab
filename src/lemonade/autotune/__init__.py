"""Auto-tune: the machine's hardware archetype, performance profiles for it, and `lemonade bench`
that measures the parameters those profiles hold (docs: auto-tune section of README, spec auto-tune.md)."""
