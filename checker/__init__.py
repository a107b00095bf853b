"""Checkers that decide from an operation history alone whether a run was correct."""
