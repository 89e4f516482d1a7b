"""Benchmark suites behind ``mpiml bench comm|ml`` and ``mpiml tune``."""
