"""Tests of mpiml.linear_model (a package, so that its test module names may repeat in other folders)."""
