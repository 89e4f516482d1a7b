"""The random forests' kernel family: per-node histograms of binned rows, the split search over them and the
partition of a level's rows into the children (``histograms.cu``, launched by :mod:`.histograms`)."""
