"""One MPI rank for the real-mpirun test: an MPI_Allreduce, and where this rank ran.

    allreduce.py RESULT_DIR PEER_IP

Writes RESULT_DIR/rank-<rank>.json: the sums it got back, its (UTS) hostname, MPI's processor
name, the inode of its network namespace and the address it reaches PEER_IP from.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from array import array
from pathlib import Path

from mpi4py import MPI


def local_address(peer: str) -> str:
    """The address this host sends from to reach `peer` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return str(s.getsockname()[0])


def main() -> None:
    result_dir, peer = Path(sys.argv[1]), sys.argv[2]
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    send = array("d", [float(rank + 1), float(10 ** rank)])
    received = array("d", [0.0, 0.0])
    comm.Allreduce(send, received, op=MPI.SUM)
    gathered_hosts = comm.allgather(socket.gethostname())
    result = {
        "rank": rank,
        "size": size,
        "sum": list(received),
        "hostname": socket.gethostname(),
        "processor_name": MPI.Get_processor_name(),
        "netns_inode": os.stat("/proc/self/ns/net").st_ino,
        "address": local_address(peer),
        "all_hosts": gathered_hosts,
        "mpi_library": MPI.Get_library_version().splitlines()[0].rstrip("\x00"),
    }
    (result_dir / f"rank-{rank}.json").write_text(json.dumps(result))
    comm.Barrier()


if __name__ == "__main__":
    main()
