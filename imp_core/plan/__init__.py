"""The plan IR (``nodes``, ``expr``), the SQL front-end (``sql``) and what is decided on plans: safety, template keys,
reuse, selection push-down. See docs/ARCHITECTURE.md, "The plan IR".
"""
