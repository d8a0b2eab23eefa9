"""Live mode: the analyzer the agent runs while a job goes on, and live peer comparison."""
