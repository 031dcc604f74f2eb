"""Models of the cluster as the console sees it. None yet: they arrive with the broker link."""
