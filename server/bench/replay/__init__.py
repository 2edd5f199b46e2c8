"""Real-engine trace replay: the simulator's comparison, measured on the local engine."""
