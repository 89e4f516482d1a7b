"""Tests of mpiml.decomposition (a package, so that its test module names may repeat in other folders)."""
