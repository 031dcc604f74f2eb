"""What the tests share: helpers that are not fixtures."""
