"""From settings to trials: the typed config, the planner, plugins, users' models."""
