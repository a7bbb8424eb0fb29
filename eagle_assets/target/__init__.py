"""Target models: the tiny local stand-in for Kimi K2.5 (``tiny``) used by the demo and the tests."""
