"""Run one rank's command as a child and outlive it: a launcher that does not tear the job down.

``mpiexec -n N python keep_survivors.py OUT_DIR SURVIVORS python script ...``: each rank runs
``python script ...`` as its child (inheriting the launcher's PMI connection).  MPICH's and
Open MPI's launchers end the whole job when one rank dies; here the process they watch stays:
if its child is killed, it waits until the survivors have written their records
(``OUT_DIR/rank<k>.json`` for k < SURVIVORS, at most 60 s) and exits 0, as a rank on a node whose
launcher daemon lets the others go on.
"""

import os
import subprocess
import sys
import time

out, survivors, cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
child = subprocess.Popen(cmd, close_fds=False)
rc = child.wait()
if rc < 0:  # killed by a signal: stay, so the launcher sees nothing wrong until the others are done
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(out, f"rank{k}.json")) for k in range(survivors)):
        time.sleep(0.05)
    rc = 0
sys.exit(rc)
