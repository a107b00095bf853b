"""Workload clients that drive the system and record operation histories."""
