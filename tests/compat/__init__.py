"""Runs of other projects' test suites against brokerd (see docs/compatibility.md)."""
