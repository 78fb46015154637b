"""Every message family the catalog reads, one real line each (wordings from
shared/research/pytorch-messages.md and nccl-messages.md, several versions where they differ):
each line becomes its event kind with its fields, through the same scanner `analyze` uses."""

from __future__ import annotations

import io
import json
from datetime import datetime

import pytest

from ddp_autopsy.analyzer.events import FileContext, scan_text
from ddp_autopsy.analyzer.patterns import PATTERNS

EXAMPLES: list[tuple[str, str, dict]] = [
    # rendezvous / TCPStore / sockets
    ("port_in_use", "[W socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29500 "
     "(errno: 98 - Address already in use).", {}),
    ("unresolved_host", "[W socket.cpp:697] [c10d] The IPv6 network addresses of (nodeX, 29500) "
     "cannot be retrieved (gai error: -2 - Name or service not known).", {}),
    ("unresolved_host", "socket.gaierror: [Errno -2] Name or service not known", {}),
    ("run_start", "initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/4", {"rank": 1, "world": 4}),
    ("connect_timeout", "torch.distributed.DistNetworkError: The client socket has timed out after "
     "60s while trying to connect to (10.0.0.1, 29500).", {}),
    ("connect_failed", "RuntimeError: The client socket has failed to connect to any network "
     "address of (10.0.0.1, 29500).", {}),
    ("store_clients_timeout", "torch.distributed.DistStoreError: Timed out after 601 seconds "
     "waiting for clients. 2/3 clients joined.", {"joined": 2, "world": 3}),
    ("store_wait_timeout", "RuntimeError: wait timeout after 30000ms, keys: /default_pg/0//cuda//0",
     {"ms": 30000}),
    ("monitored_barrier_failed", "RuntimeError: [Rank 0]: Ranks 1, 3 failed to pass "
     "monitoredBarrier in 1800000 ms", {"ranks": "1, 3", "ms": 1800000}),
    ("monitored_barrier_timeout", "RuntimeError: Rank 0 timed out in monitoredBarrier after 2000 "
     "ms. Successfully processed ranks: 1, 2", {"by": 0, "ms": 2000, "processed": "1, 2"}),
    ("monitored_barrier_peer_error", "RuntimeError: Rank 2 successfully reached monitoredBarrier, "
     "but received errors while waiting for send/recv from rank 0. Please check rank 0 logs for "
     "faulty rank.", {"by": 2, "peer": 0}),
    # collectives and the watchdog
    ("collective_fingerprint_mismatch", "RuntimeError: Detected mismatch between collectives on "
     "ranks. Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=5, "
     "OpType=ALLREDUCE, TensorShape=[10], TensorDtypes=Float, TensorDeviceTypes=cuda), but Rank 1 "
     "is running collective: CollectiveFingerPrint(SequenceNumber=5, OpType=BROADCAST, "
     "TensorShape=[10], TensorDtypes=Float, TensorDeviceTypes=cuda).Collectives differ in the "
     "following aspects: 	 Op type: ALLREDUCEvs BROADCAST", {"r1": 0, "r2": 1}),
    ("watchdog_timeout", "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:616] [Rank 0] "
     "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, "
     "NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds "
     "before timing out.", {"seq": 1, "op": "BROADCAST", "timeout_ms": 600000}),
    ("watchdog_timeout", "[Rank 3] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800478 milliseconds "
     "before timing out.", {"seq": 7, "op": "ALLREDUCE"}),  # ~1.10-2.1
    ("watchdog_summary", "[PG ID 1 PG GUID 1 Rank 1]  failure detected by watchdog at work "
     "sequence id: 1 PG status: last enqueued work: 547, last completed work: -1",
     {"seq": 1, "enqueued": 547, "completed": -1}),
    ("watchdog_summary", "[PG 1 Rank 0] Exception (either an error or timeout) detected by "
     "watchdog at work: 1580, last enqueued NCCL work: 1582, last completed NCCL work: 1579.",
     {"seq": 1580, "enqueued": 1582, "completed": 1579}),  # 2.4-2.6
    ("watchdog_abort", "Exception raised from checkTimeout at "
     "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632 (most recent call first):", {}),
    ("desync_timeout_at", "         - [0] Timeout at collective: ALLREDUCE, #315",
     {"by": 0, "op": "ALLREDUCE", "seq": 315}),
    ("desync_not_joined", "             [7] finished collective #182, but didn't join collective "
     "#183 (count from 1)", {"ranks": "7", "done": 182, "seq": 183}),
    ("desync_not_finished", "             [2, 5] joined but didn't finish collective #90 (count "
     "from 1)", {"ranks": "2, 5", "seq": 90}),
    ("desync_never_joined", "ranks [3] are the lagging ranks that caused this timeout. They never "
     "joined any collectives", {"ranks": "3"}),
    ("watchdog_hang", "[PG 0 Rank 1] Heartbeat monitor timed out! Process will be terminated after "
     "dumping debug info. workMetaList_.size()=103", {}),
    ("watchdog_hang", "[F1023 10:52:25.404000 ProcessGroupNCCL.cpp:1224] [PG ID 0 PG GUID 0(default"
     "_pg) Rank 6] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress "
     "in monitoring enqueued collectives.", {"seconds": 480}),
    ("gloo_timeout", "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
     "Timed out waiting 12000ms for recv operation to complete", {"ms": 12000, "op": "recv"}),
    ("gloo_connect_failure", "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/"
     "gloo/transport/tcp/pair.cc:144] timed out connecting: SO_ERROR: Connection refused, "
     "remote=[127.0.0.1]:21926", {"addr": "127.0.0.1", "port": 21926}),
    ("init_file_url", "| distributed init (rank 1): file:///nfs/job/dist_init",
     {"path": "/nfs/job/dist_init"}),
    ("peer_closed", "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] "
     "Connection closed by peer [10.0.0.2]:8594", {}),
    ("peer_closed", "[W socket.cpp:1] [c10d] recvValue failed on SocketImpl(fd=86, "
     "addr=[localhost]:54074, remote=[localhost]:29500): Failed to recv, got 0 bytes. Connection "
     "was likely closed. Did the remote server shutdown or crash?", {}),
    ("closing_signal", "W1026 03:51:31.222000 2521679 torch/distributed/elastic/multiprocessing/"
     "api.py:908] Sending process 2521733 closing signal SIGTERM", {}),
    ("oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", {}),
    ("oom", "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCCachingHostAllocator.cpp line=278 "
     "error=2 : out of memory", {"cuda": "out of memory"}),
    ("cuda_failure", "THCudaCheck FAIL file=/opt/conda/conda-bld/pytorch_1595629403081/work/torch/"
     "csrc/cuda/Module.cpp line=59 error=101 : invalid device ordinal",
     {"code": 101, "err": "invalid device ordinal"}),
    ("port_in_use", "RuntimeError: Only one usage of each socket address (protocol/network "
     "address/port) is normally permitted.", {}),
    ("port_in_use", "OSError: [WinError 10048] Only one usage of each socket address "
     "(protocol/network address/port) is normally permitted", {}),
    ("oom", "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.50 GiB. GPU 3 has a "
     "total capacity of 63.98 GiB", {}),
    ("oom", "RuntimeError: NPU out of memory. Tried to allocate 30.00 MiB (NPU 3; 60.96 GiB total "
     "capacity)", {"tried": "30.00 MiB"}),
    ("oom", "|CCL_ERROR| ze error at zeCommandQueueExecuteCommandLists, code: "
     "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", {}),
    ("watchdog_timeout", "[Rank 3] Watchdog caught collective operation timeout: WorkHCCL(SeqNum="
     "196, OpType=ALLREDUCE, Timeout(ms)=3600000) ran for 3600120 milliseconds before timing out.",
     {"seq": 196, "op": "ALLREDUCE", "pgrank": 3}),
    ("watchdog_timeout", "[rank6] Watchdog caught collective operation timeout: WorkNCCL(SeqNum="
     "1320347, OpType=ALLREDUCE, NumelIn=4501504, NumelOut=4501504, Timeout(ms)=600000)",
     {"seq": 1320347, "nin": 4501504}),
    ("duplicate_gpu", "Duplicate GPU detected : rank 3 and rank 0 both on CUDA device",
     {"r1": 3, "r2": 0}),
    ("unused_parameters", "RuntimeError: Expected to have finished reduction in the prior "
     "iteration before starting a new one.", {}),
    # older and other wordings (docs/messages.md)
    ("listen_failed", "torch.distributed.DistNetworkError: The server socket has failed to listen "
     "on any local network address. The server socket has failed to bind to 10.0.0.9:29500 "
     "(errno: 99 - Cannot assign requested address).", {"errno": 99}),
    ("listen_failed", "torch.distributed.DistStoreError: The server socket has failed to bind. "
     "useIpv6: 0, code: -99, name: EADDRNOTAVAIL, message: address not available",
     {"errno": 99}),  # libuv store
    ("port_in_use", "ConnectionError: Tried to launch distributed communication on port `29500`, "
     "but another process is utilizing it.", {"port": 29500}),
    ("unresolved_host", "ValueError: host not found: Name or service not known",
     {"msg": "Name or service not known"}),  # torch <= 1.8
    ("unresolved_host", "node-1: ssh: Could not resolve hostname node-0: Name or service not "
     "known", {"host": "node-0"}),
    ("connect_timeout", "RuntimeError: connect() timed out. Original timeout was 60000 ms.",
     {"t": 60000, "unit": "ms"}),
    ("connect_failed", "RuntimeError: Connection refused", {"err": "Connection refused"}),
    ("connect_retry", "[W socket.cpp:601] [c10d] The client socket has failed to connect to "
     "[node-0]:29500 (errno: 111 - Connection refused).",
     {"host": "node-0", "port": 29500, "errno": 111}),
    ("connect_failed", "[W socket.cpp:601] [c10d] The client socket has failed to connect to "
     "[node-0]:29500 (errno: 110 - Connection timed out).",
     {"host": "node-0", "port": 29500, "errno": 110}),
    ("store_wait_timeout", "[rank1]:[W516 14:34:56.854597329 socket.cpp:489] [c10d] waitForInput: "
     "socket SocketImpl(fd=79, addr=[localhost]:41170, remote=[localhost]:29500) timed out after "
     "1800000ms", {"ms": 1800000, "remote": "[localhost]:29500"}),
    ("store_wait_timeout", "[rank3]: torch.distributed.DistBackendError: [3] is setting up NCCL "
     "communicator and retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but "
     "store->get('0') got error: wait timeout after 600000ms", {"rank": 3, "root": 0, "keys": "0"}),
    ("watchdog_timeout", "[E ProcessGroupNCCL.cpp:565] [Rank 1] Work WorkNCCL(SeqNum=9, "
     "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=60000) timed out in blocking wait "
     "(NCCL_BLOCKING_WAIT=1).", {"seq": 9, "timeout_ms": 60000}),  # 2.2+
    ("watchdog_hang", "[E ProcessGroupNCCL.cpp:1155] [Rank 1] monitoring thread detects no "
     "heartbeat and will finally kill the process!", {}),  # 2.2
    ("nccl_comm_aborted", "RuntimeError: NCCL communicator was aborted on rank 2.  Original reason "
     "for failure was: NCCL error: unhandled system error, NCCL version 2.10.3", {"rank": 2}),
    ("cpp_terminate", "terminate called after throwing an instance of 'c10::DistBackendError'",
     {"type": "c10::DistBackendError"}),
    ("cuda_failure", "RuntimeError: CUDA error: an illegal memory access was encountered",
     {"err": "an illegal memory access was encountered"}),
    ("nccl_teardown", "[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. "
     "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
     "corrupted/incomplete data.", {}),
    ("unresolved_host", "nslookup: can't resolve 'job-master-0': Name does not resolve",
     {"host": "job-master-0"}),
    ("store_clients_timeout", "RuntimeError: Timed out initializing process group in store based "
     "barrier on rank: 3, for key: store_based_barrier_key:1 (world_size=8, worker_count=7, "
     "timeout=0:30:00)", {"rank": 3, "world": 8, "joined": 7}),
    ("store_barrier_done", "INFO:torch.distributed.distributed_c10d:Rank 2: Completed store-based "
     "barrier for key:store_based_barrier_key:2 with 4 nodes.",
     {"rank": 2, "key": "store_based_barrier_key:2", "world": 4}),
    ("store_barrier_wait", "INFO:torch.distributed.distributed_c10d:Waiting in store based barrier "
     "to initialize process group for rank: 0, key: store_based_barrier_key:1 (world_size=2, "
     "worker_count=4, timeout=0:30:00)", {"rank": 0, "world": 2, "joined": 4}),
    ("watchdog_timeout", "RuntimeError: Work WorkNCCL(SeqNum=44, OpType=ALLGATHER, "
     "Timeout(ms)=600000) timed out in call to wait().",
     {"seq": 44, "op": "ALLGATHER", "timeout_ms": 600000}),  # NCCL_BLOCKING_WAIT=1
    ("unused_parameters", "Parameter indices which did not receive grad: 197 198",
     {"params": "197 198"}),
    ("closing_signal", "Unable to shutdown process 4797 via 15, forcefully exiting via 9",
     {"pid": 4797, "signal": "SIGKILL"}),  # Python 3.11+: the enum prints as its number
    ("worker_group_failed", "[2021-05-21 23:18:16,220] api: [default] Worker group FAILED. 3/3 "
     "attempts left; will restart worker group", {"left": 3}),
    ("watchdog_summary", "[rank3]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 3] Timeout at NCCL "
     "work: 2081, last enqueued NCCL work: 2081, last completed NCCL work: 2080.",
     {"seq": 2081, "enqueued": 2081, "completed": 2080}),  # 2.2-2.3
    ("dump_signal", "[PG ID 0 PG GUID 0(default_pg) Rank 0] Received a dump signal due to a "
     "collective timeout from  rank 3 and we will try our best to dump the debug info. Last "
     "enqueued NCCL work: 715, last completed NCCL work: 715.", {"src": 3, "completed": 715}),
    ("watchdog_progress", "[PG ID 0 PG GUID 0(default_pg) Rank 1] NCCL Work update periodically: "
     "last enqueued NCCL work: 312, last completed NCCL work: 311.",
     {"enqueued": 312, "completed": 311}),
    ("gloo_timeout", "RuntimeError: Application timeout caused pair closure", {}),
    ("gloo_timeout", "RuntimeError: [/opt/conda/conda-bld/pytorch_1532579245307/work/third_party/"
     "gloo/gloo/transport/tcp/buffer.cc:76] Read timeout [127.0.0.1]:32444",  # s13-007
     {"rw": "Read", "peer": "127.0.0.1"}),
    ("collective_fingerprint_mismatch", "RuntimeError: Detected mismatch between collectives on "
     "ranks. Rank 0 is running inconsistent collective: CollectiveFingerPrint(OpType=BROADCAST, "
     "TensorShape=[4], TensorDtypes=Float)", {"r1": 0}),  # torch 1.10 wording, s13-008
    ("nccl_connect_failure", "[rank1]: NET/OFI Unable to insert remote address into address "
     "vector for device 1. RC: 0", {"ofi": "Unable to insert remote address into address "
                                          "vector"}),  # aws-ofi-nccl, s13-023
    ("network_error", "[rank3]: NET/OFI Request 0x7f14cc5b60c0 completed with error. RC: 113. "
     "Error: 2 (UNDELIVERABLE). Completed length: 0", {"rc": "113", "err": "UNDELIVERABLE"}),
    ("gloo_size_mismatch", "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/"
     "pair.cc:446] op.preamble.length <= op.nbytes. 8 vs 4", {"got": 8, "want": 4}),
    ("gloo_connect_failure", "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:799] "
     "connect [127.0.1.1]:27389: Connection refused", {"addr": "127.0.1.1", "port": 27389}),
    ("peer_closed", "[W1122 10:00:00.123456789 socket.cpp:1] [c10d] sendBytes failed on "
     "SocketImpl(fd=12, addr=[node-1]:44556, remote=[node-0]:29500): Broken pipe", {}),
    ("worker_failed", "[2023-11-13 16:59:55,650] [ERROR] [launch.py:320:sigkill_handler] "
     "['/usr/bin/python', '-u', 'train.py', '--local_rank=1'] exits with return code = -9",
     {"exitcode": -9, "local_rank": 1}),
    ("worker_failed", "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) "
     "local_rank: 2 (pid: 1811) of fn: main (start_method: spawn)", {"exitcode": -9}),
    ("closing_signal", "W1122 10:00:00.000000 4242 torch/multiprocessing/spawn.py:165] "
     "Terminating process 4243 via signal SIGTERM", {"pid": 4243, "signal": "SIGTERM"}),
    ("closing_signal", "Unable to shutdown process 4797 via Signals.SIGTERM, forcefully exiting "
     "via Signals.SIGKILL", {"pid": 4797, "signal": "SIGKILL"}),
    ("worker_group_failed", "[default] Worker group FAILED. 3/3 attempts left; will restart worker "
     "group", {"role": "default", "left": 3, "max": 3}),
    ("oom", "Memory on the node (IP: 10.0.0.5, ID: 2b4e5f) where the task was running was 28.50GB "
     "/ 30.00GB (0.95), which exceeds the memory usage threshold of 0.95.", {"ip": "10.0.0.5"}),
    ("oom", "Memory on the node (IP: 10.1.180.84, ID: ba65c80c) where the task (task ID: d221d2, "
     "name=head, rank=0,, pid=4503, memory used=0.02GB) was running was 1.9TB / 2.0TB (0.95)",
     {"ip": "10.1.180.84", "victim": "0"}),
    ("oom", "RuntimeError: CUDA error: out of memory", {"cuda": "CUDA error: out of memory"}),
    ("oom", "RuntimeError: [enforce fail at alloc_cpu.cpp:83] err == 0. DefaultCPUAllocator: "
     "can't allocate memory: you tried to allocate 3221225472 bytes. Error code 12 (Cannot "
     "allocate memory)", {"cpu": "can't allocate memory"}),
    # torch before 1.6: no NCCL version after the error string
    ("nccl_error", "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:272, "
     "unhandled system error", {"estr": "unhandled system error"}),
    ("nccl_interface", "gpu-1012:4152:4206 [0] NCCL INFO NET : Using interface lo:127.0.0.1<0>",
     {"ifname": "lo", "addr": "127.0.0.1"}),  # NCCL 2.3
    ("nccl_connect_failure", "gpu-1012:4153:4209 [1] include/socket.h:361 NCCL WARN Call to "
     "connect timeout : Connection refused", {"err": "Connection refused"}),  # NCCL 2.3
    ("nccl_error_trace", "node03:2330:2658 [2] NCCL INFO bootstrap.cc:270 -> 2",
     {"file": "bootstrap.cc", "code": 2}),
    ("visible_devices", "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0,1]",
     {"local_rank": 0, "devices": "0,1"}),  # Lightning
    ("worker_signal", "  traceback : Signal 11 (SIGSEGV) received by PID 6421",
     {"signum": 11, "signal": "SIGSEGV", "pid": 6421}),  # a summary field without its header
    ("inputs_exhausted", "RuntimeError: Rank 1 exhausted all inputs.", {"exhausted": 1}),
    ("inputs_exhausted", "RuntimeError: Detected at least one rank that exhausted inputs. "
     "Throwing across all ranks.", {}),
    # the node count a launch asked for (a pasted command line, torchelastic's launch config)
    ("launch_nodes", "python -m torch.distributed.launch --nnode=2 --node_rank=1 "
     "--nproc_per_node=1 train.py", {"n": 2}),
    ("launch_nodes", "torchrun --nnodes 1:4 --nproc-per-node 8 train.py", {"n": 1, "max": 4}),
    # SLURM (src/srun, task/cgroup): a task's end, and the cgroup OOM handler
    ("srun_task_failed", "srun: error: nid001: task 3: Exited with exit code 1",
     {"node": "nid001", "tasks": "3", "exitcode": 1}),
    ("srun_task_failed", "srun: error: gpu7: tasks 0-5,7: Killed", {"tasks": "0-5,7"}),
    ("srun_task_failed", "srun: error: ... Aborted (core dumped)", {"what": "Aborted (core dumped)"}),
    ("oom", "srun: error: nid001: task 3: Out Of Memory", {"node": "nid001", "tasks": "3"}),
    ("oom", "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=1234.0. Some of your "
     "processes may have been killed by the cgroup out-of-memory handler.", {}),
    # the watchdog's line as a user shortened it in a paste
    ("watchdog_timeout", "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(..., "
     "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800090 milliseconds "
     "before timing out.", {"pgrank": 0, "op": "ALLREDUCE", "timeout_ms": 1800000,
                            "ran_ms": 1800090}),
    ("unused_parameters", "Parameter indices which did not receive grad for rank 1: 24 25",
     {"rank": 1, "params": "24 25"}),
    ("unused_parameters", "RuntimeError: It looks like your LightningModule has parameters that "
     "were not used in producing the loss returned by training_step.", {}),
    ("ddp_model_mismatch", "RuntimeError: DDP expects same model across all ranks, but Rank 0 has "
     "200 params, while rank 1 has inconsistent 198 params.", {"r1": 0, "r2": 1, "n2": 198}),
    ("init_file_url", "File already exists: output.tmp/dist_init", {"path": "output.tmp/dist_init"}),
    ("external_signal", "slurmstepd: error: *** STEP 5559.0 ON node3 CANCELLED AT "
     "2025-01-10T15:27:25 DUE TO TIME LIMIT ***", {"reason": "TIME LIMIT", "node": "node3"}),
    # NCCL
    ("nccl_version", "gpu1:4242:4242 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
     {"version": "2.21.5", "cuda": "12.4"}),
    ("nccl_version", "[I1122 10:00:00.000000000 ProcessGroupNCCL.cpp:950] [PG ID 0 PG GUID 0 Rank "
     "0] ProcessGroupNCCL environments: NCCL version: 2.21.5, TORCH_NCCL_ASYNC_ERROR_HANDLING: 3",
     {"version": "2.21.5"}),
    ("nccl_version_mismatch", "gpu2:1:1 [1] init.cc:1 NCCL WARN Mismatched NCCL version detected "
     ": rank 3 version 22304 rank 0 version 22703", {"r1": 3, "r2": 0}),
    ("nccl_interface", "gpu1:4242:4242 [0] NCCL INFO Bootstrap : Using eth0:10.1.2.3<0>",
     {"ifname": "eth0", "addr": "10.1.2.3"}),
    ("nccl_connect_failure", "gpu1:1:2 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: "
     "exceeded retries (35)", {"n": "35"}),
    ("no_socket_interface", "gpu1:1:1 [0] NCCL WARN Bootstrap : no socket interface found", {}),
    ("collective_fingerprint_mismatch", "RuntimeError: Detected mismatch between collectives on "
     "ranks. Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=15, OpType="
     "ALLREDUCE), but Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=0, "
     "OpType=REDUCE)", {"r1": 0, "r2": 1}),
    ("gpus_requested_unavailable", "MisconfigurationException('You requested gpu: [0, 1, 2, 3]\\n "
     "But your machine only has: [0]')", {"asked": "0, 1, 2, 3", "have": "0"}),
    ("exception", "[2021-12-14 10:18:27.983077: E /tmp/horovod/common/operations.cc:649] [1]: "
     "Horovod background loop uncaught exception: CUDA error: invalid configuration argument",
     {"rank": 1, "type": "Horovod background loop uncaught exception"}),
    ("ssh_failed", "root@tensorflow-benchmarks-worker-0.tensorflow-benchmarks-worker: Permission "
     "denied (publickey,password).",
     {"host": "tensorflow-benchmarks-worker-0.tensorflow-benchmarks-worker"}),
    ("ssh_failed", "ssh: connect to host node3 port 22: Connection refused",
     {"host": "node3", "err": "Connection refused"}),
    ("mpi_daemon_lost", "  Remote daemon: [[43015,0],20] on node train-worker-19",
     {"node": "train-worker-19"}),
    ("backend_device_mismatch", "RuntimeError: CUDA tensor detected and the MPI used doesn't have "
     "CUDA-aware MPI support", {}),
    ("shm_error", "gpu12:88213:88213 [3] misc/shmutils.cc:87 NCCL WARN unlink shared memory "
     "/dev/shm/nccl-d5rTd0 failed, error: No such file or directory",
     {"path": "/dev/shm/nccl-d5rTd0", "err": "No such file or directory"}),
    ("collective_shape_mismatch", "RuntimeError: Error when verifying shape tensors for collective "
     "ALLREDUCE on rank 0. This likely indicates that input shapes into the collective are "
     "mismatched across ranks. Got shapes:  10", {"op": "ALLREDUCE", "by": 0, "shape": "10"}),
    ("collective_shape_mismatch", "accelerate.utils.operations.DistributedOperationException: "
     "Cannot apply desired operation due to shape mismatches. All shapes across devices must be "
     "valid.", {}),
    ("native_signal", "*** SIGSEGV received at time=1775734074 on cpu 19 ***", {"signum": 11}),
    ("pg_not_destroyed", "[rank0]:[W205 18:00:34.257100231 ProcessGroupNCCL.cpp:1496] Warning: "
     "WARNING: destroy_process_group() was not called before program exit, which can leak "
     "resources.", {}),
    ("watchdog_timeout", "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL("
     "SeqNum=1, OpType=BROADCAST, Timeout(ms)=1800000) ran for 1800056 millis econds before "
     "timing out.", {"seq": 1, "op": "BROADCAST"}),
    ("closing_signal", "[2023-09-10 11:45:59,501] [INFO] [launch.py:428:sigkill_handler] Killing "
     "subprocess 6294", {"pid": 6294}),
    ("cuda_driver_too_old", "idgsim-gpu-001:47744:47744 [0] init.cu:674 WARN Cuda failure 'CUDA "
     "driver version is insufficient for CUDA runtime version'", {}),
    ("cuda_driver_too_old", "RuntimeError: The NVIDIA driver on your system is too old (found "
     "version 10010). Please update your GPU driver", {"found": "10010"}),
    ("cuda_failure", "Cuda failure common.cu:891 'CUDA driver version is insufficient for CUDA "
     "runtime version'", {"err": "CUDA driver version is insufficient for CUDA runtime version"}),
    ("parallel_layout_mismatch", "RuntimeError: world_size (8) is not divisible by "
     "expert_tensor_model_pipeline_parallel size (16)", {"world": 8}),
    ("parallel_layout_mismatch", "RuntimeError: [TensorRT-LLM][ERROR] Assertion failed: mpiSize "
     "== tp * pp (/opt/tensorrt-llm/cpp/tensorrt_llm/runtime/worldConfig.cpp:89)",
     {"layout": "mpiSize == tp * pp"}),
    ("parallel_layout_mismatch", "ValueError: The number of required GPUs exceeds the total "
     "number of available GPUs in the placement group.", {}),
    ("nccl_net_channel", "pkb-aa8dbd1b-0:9100:9147 [0] NCCL INFO Ring 00 : 1[18100000] -> "
     "0[435e00000] [receive] via NET/IB/0/GDRDMA", {"src": 1, "dst": 0, "net": "IB"}),
    ("nccl_net_channel", "node1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via "
     "NET/Socket/0", {"src": 0, "dst": 8, "net": "Socket"}),
    ("nccl_connect_failure", "[Service thread] Error encountered progressing operation=Connect, "
     "res=3, closing connection", {"op": "Connect", "res": 3}),
    ("nccl_error", "RuntimeError: NCCL error in ../torch/lib/c10d/ProcessGroupNCCL.cpp:825, "
     "unhandled system error, NCCL version 2.7.8", {"estr": "unhandled system error"}),
    ("checkpoint_world_mismatch", "AssertionError: Loading a checkpoint for MP=2 but world size "
     "is 1", {"mp": 2, "ws": "1"}),
    ("autograd_anomaly", "/torch/autograd/__init__.py:197: UserWarning: Error detected in "
     "torch::autograd::AccumulateGrad. Traceback of forward call that caused the error:",
     {"node": "torch::autograd::AccumulateGrad"}),
    ("no_socket_interface", "RuntimeError: [enforce fail at /opt/conda/conda-bld/pytorch_1595629427478"
     "/work/third_party/gloo/gloo/transport/tcp/device.cc:208] ifa != nullptr. Unable to find "
     "interface for: [0.0.8.34]", {"addr": "0.0.8.34"}),
    ("nccl_subnet_mismatch", "e82c50601d13:213:213 [0] include/socket.h:197 NCCL WARN Net : No "
     "interface found in the same subnet as remote address 192.168.0.91<27030>",
     {"addr": "192.168.0.91"}),
    ("duplicate_gpu", "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 2000",
     {"r1": 0, "r2": 1}),
    ("shm_error", "gpu1:1:1 [0] include/shm.h:48 NCCL WARN Error: failed to extend "
     "/dev/shm/nccl-03v824 to 9637892 bytes, error: No space left on device (28)",
     {"errno": 28}),
    ("shm_error", "gpu1:1:1 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No "
     "space left on device", {"err": "No space left on device"}),  # <= 2.11
    ("network_error", "gpu3:1:9 [0] NCCL WARN socketProgressOpt: Call to recv from 10.0.0.2<4563> "
     "failed : Connection reset by peer", {}),
    ("nccl_message_truncated", "gpu2:4021:4130 [1] transport/net_socket.cc:544 NCCL WARN "
     "NET/Socket : peer 10.0.0.1<43561> message truncated : receiving 1048576 bytes instead of "
     "65536. If you believe your socket network is in healthy state,     there may be a mismatch "
     "in collective sizes or environment settings (e.g. NCCL_PROTO, NCCL_ALGO) between ranks",
     {"got": 1048576, "want": 65536}),
    ("nccl_bootstrap_mismatch", "gpu1:7:9 [0] bootstrap.cc:254 NCCL WARN Bootstrap Root : mismatch "
     "in rank count from procs 4 : 8", {"a": 4, "b": 8}),
    ("nccl_bootstrap_mismatch", "gpu1:7:9 [0] NCCL WARN Bootstrap Root : mismatch in info from "
     "procs, nranks 4 vs 8, nroots 1 vs 1, iroot 0 vs 0", {"n1": 4, "n2": 8}),
    ("cuda_failure", "gpu1:1:1 [0] enqueue.cc:1 NCCL WARN Cuda failure 700 'an illegal memory "
     "access was encountered'", {"code": 700, "err": "an illegal memory access was encountered"}),
    ("nccl_connect_failure", "gpu1:1:1 [0] misc/socket.cc:538 NCCL WARN socketPollConnect: Connect "
     "to 10.0.0.2<43211> returned 113(No route to host) errno 115(Operation now in progress)",
     {"fn": "socketPollConnect", "addr": "10.0.0.2<43211>", "code": 113}),  # 2.20-2.23
    ("nccl_connect_failure", "gpu1:1:1 [0] NCCL INFO socketPollConnect: connect returned No route "
     "to host, retrying (34/34) after sleep for 3400 msec", {"err": "No route to host"}),
    ("nccl_connect_retry", "gpu1:1:1 [0] NCCL INFO socketPollConnect: connect returned Connection "
     "refused, retrying (3/34) after sleep for 300 msec", {"max": 34}),
    ("nccl_connect_retry", "gpu1:1:1 [0] NCCL INFO Call to connect returned Connection refused, "
     "retrying", {"err": "Connection refused"}),  # 2.4-2.15
    ("nccl_collective_mismatch", "gpu1:1:1 [0] init.cc:208 NCCL WARN Your program may be hanging, "
     "this may be caused by a collective mismatch around rank 3. Please check your collective "
     "calls at and around this rank.", {"around": 3}),
    ("nccl_collective_mismatch", "init.cc:1247 NCCL WARN Mismatched collective detected, please "
     "check your collective calls at and around rank 39. You can use NCCL_DEBUG=INFO and "
     "NCCL_DEBUG_SUBSYS=COLL to see the collective logs", {"around": 39}),
    ("nccl_invalid_rank", "worker-1:25:25 [0] init.cc:981 NCCL WARN Invalid rank requested : 2/2",
     {"asked": 2, "nranks": 2}),
    ("nccl_message_truncated", "gpu2:1:1 [3] transport/net_ib.cc:1213 NCCL WARN NET/IB : req 1/1 "
     "tag 7 peer 10.0.0.1<41203> collective mismatch error, local size 1048576 remote size 524288",
     {"want": 1048576, "got": 524288}),
    ("cuda_failure", "gpu1:1:1 [1] transport/p2p.cc:169 NCCL WARN failed to open CUDA IPC handle : "
     "217 peer access is not supported between these two devices", {"code": 217}),
    ("nccl_warn", "gpu1:1:1 [0] graph/rings.cc:47 NCCL WARN Error : ring 3 does not loop back to "
     "start (5 != 0)", {"msg": "Error : ring 3 does not loop back to start (5 != 0)"}),
    ("nccl_version_mismatch", "gpu1:1:1 [0] dev_runtime.cc:1444 NCCL WARN NCCL library is not "
     "backwards compatible. This application was compiled with NCCL version 2.29.7", {}),
    ("nccl_error", "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
     "c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for "
     "details), NCCL version 2.19.3", {"version": "2.19.3"}),
    # lines a paste or an excerpt cut short: the family is still read, with what is shown
    ("watchdog_timeout", "[rank4]:[E424 01:11:21.160857258 ProcessGroupNCCL.cpp:629] [Rank 4] "
     "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelI",
     {"seq": 4, "op": "BROADCAST", "pgrank": 4}),
    ("watchdog_timeout", "[Rank 2] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=17, OpTy", {"seq": 17}),
    ("shm_error", "Error while creating shared memory segment /dev/shm/nccl-lNPZ0f (size 734038",
     {"op": "creating"}),
    ("native_signal", "[k8s-slave03:00956] Signal: Segmentation fault (11)",
     {"signum": 11, "pid": 956}),
    ("native_signal", "[pontus:72547] Signal: Segmentation fault: 11 (11)", {"signum": 11}),
    ("native_signal", "[rtptest1621:405884] *** Process received signal ***", {"pid": 405884}),
    ("external_signal", "[2026-04-20T03:25:23.011] error: *** STEP 1942963.1 ON",
     {"what": "STEP", "id": "1942963.1"}),
    ("python_start_failed", "/usr/bin/python3: No module named train_ddp",
     {"module": "train_ddp"}),
    ("python_start_failed", "/opt/conda/bin/python: can't open file '/workspace/train.py': "
     "[Errno 2] No such file or directory", {"path": "/workspace/train.py", "errno": 2}),
    ("mpi_process_exit", "mpirun noticed that process rank 1 with PID xxxxxx on node xxxxxxxx "
     "exited on signal 9 (Killed).", {"rank": 1, "signum": 9}),
    ("mpi_process_exit", "  Process name: [[50371,1],3]", {"rank": 3}),
    ("mpi_process_exit", "x1921c7s1b0n0: rank 12 died from signal 9", {"rank": 12, "signum": 9}),
    ("mpi_process_exit", "nid0042: rank  3 exited with code 1", {"rank": 3, "exitcode": 1}),
    ("dataloader_worker_signal", "ERROR: Unexpected segmentation fault encountered in worker.",
     {"what": "segmentation fault"}),
    ("remote_command_failed", "pdsh@worker-0: worker-1: ssh exited with exit code 1",
     {"node": "worker-1", "exitcode": 1}),
    ("port_in_use", "RuntimeError: Address already in us", {}),
    ("lightning_deadlock", "pytorch_lightning.utilities.exceptions.DeadlockDetectedException: "
     "DeadLock detected from rank: 0 ", {"rank": 0}),
    ("task_start_failed", "slurmstepd: error: pyxis: container start failed with error code: 1",
     {"code": 1}),
    ("watchdog_timeout", "[Rank 1] Watchdog caught collective operatMERS_CACHE` is deprecated and "
     "will be removed in v5 of Transformion timeout: WorkNCCL(SeqNum=2109, OpType=_ALLGATHER_BASE,"
     " NumelIn=262711296, NumelOut=525422592, Timeout(ms)=1800000) ran for 1800007 milliseconds "
     "before timing out.", {"seq": 2109, "op": "_ALLGATHER_BASE", "nin": 262711296}),
    ("nccl_error", "Failed, NCCL error transformer_engine/pytorch/csrc/userbuffers/userbuffers-"
     "host.cpp:223 'unhandled system error'", {"estr": "unhandled system error"}),
    ("fr_report", "Not all ranks joining collective, sequence number: 31117",
     {"missing_seq": 31117}),
    ("fr_report", "Collective 39 at entry 38 errors", {"error_seq": 39}),
    ("fr_report", "missing ranks: {3, 4, 5, 6, 7}", {"missing": "3, 4, 5, 6, 7"}),
    ("peer_closed", "RPC agent for parameter_server encountered error when sending response to "
     "request #4 to trainer_1: eof (this error originated at tensorpipe/transport/shm/"
     "connection_impl.cc:259)", {"peer": "trainer_1"}),
    ("port_in_use", "EJ0003: [PID: 159] 2025-03-26-17:01:02.816.428 Failed to bind the IP port. "
     "Reason: The IP address and port have been bound already.", {}),
    ("nccl_error", "RuntimeError: createHCCLComm:build/CMakeFiles/torch_npu.dir/compiler_depend.ts"
     ":1479 HCCL function error: HcclGetRootInfo(&hcclID), error code is 11",
     {"estr": "HcclGetRootInfo"}),
    ("no_socket_interface", "RuntimeError: GlooDeviceFactory::makeUVDevice(): interface or "
     "hostname can't be empty", {}),
    ("shm_error", "[2026-03-25 05:44:29,435 W 39 39] (raylet) store_runner.cc:83: System memory "
     "request exceeds memory available in /dev/shm. The request is for 10200547328 bytes, and "
     "the amount available is 9663676416 bytes.", {}),
    ("network_error", "host-2:311:405 [0] transport/net_ib.cc:199 NCCL WARN NET/IB : mlx5_32:1 "
     "Got async error event: port error", {"event": "port error"}),
    ("external_signal", "[2025-02-11 20:08:00,117 I 4121 4121] main.cc:284: Raylet graceful "
     "shutdown triggered, reason = EXPECTED_TERMINATION, reason message = received SIGTERM",
     {"signame": "SIGTERM", "reason": "EXPECTED_TERMINATION"}),
    ("store_wait_timeout", ". This may indicate a possible application crash on rank 0 or a "
     "network set up issue.", {"root": 0}),
    ("port_in_use", "[W socket.cpp:436] [c10d] The server socket has failed to bind to "
     "[DESKTOP-L9L2GVM]:10086 (system error: 10048 - 通常每个套接字地址只允许使用一次。).",
     {"port": 10086}),
    ("unresolved_host", "ssh: Could not resolve hostname localhost:4: Temporary failure in name "
     "resolution", {"host": "localhost:4"}),
    ("gloo_timeout", "RuntimeError: Resource temporarily unavailable", {}),
    ("nccl_error", "cupy_backends.cuda.libs.nccl.NcclError: NCCL_ERROR_SYSTEM_ERROR: unhandled "
     "system error (run with NCCL_DEBUG=INFO for details)", {"estr": "unhandled system error"}),
    ("nccl_error", "c2211f46f318: Test NCCL failure common.cu:1005 'unhandled CUDA error'",
     {"estr": "unhandled CUDA error"}),
    ("nccl_connect_failure", "gpu-bql-144-103:18553:18611 [0] include/socket.h:360 WARN Call to "
     "connect failed : Connection timed out", {"err": "Connection timed out"}),
    ("nccl_warn", "WARN: Function: create_nccl_ofi_component Line: 459: NET/OFI Couldn't open AV."
     " RC: -22, ERROR: Invalid argument", {}),
    ("watchdog_timeout", "RuntimeError: [Rank 1] Caught collective operation timeout: "
     "WorkNCCL(SeqNum=1, OpType=BROADCAST, TensorShape=[], Timeout(ms)=10800000) ran for "
     "10800031 milliseconds before timing out.", {"pgrank": 1, "seq": 1, "op": "BROADCAST"}),
    ("backend_device_mismatch", "RuntimeError: Function argument device_ids not supported for "
     "the selected backend gloo", {"arg": "device_ids", "backend": "gloo"}),
    ("duplicate_gpu", "Error: rank 27 and rank 19 both on CUDA device 53000 (PCI 53:00.0)",
     {"r1": 27, "r2": 19}),
    ("watchdog_timeout", "[E ProcessGroupNCCL.cpp:587] [Rank 1] Watchdog c", {"pgrank": 1}),
    ("horovod_stall", "[1,0]<stderr>:Stalled ranks:", {}),
    ("horovod_missing_rank", "[0] 1: [broadcast.assign_conv_first_modules.0.bias, "
     "broadcast.assign_conv_first_modules.0.weight ...]", {"missing": 1}),
    ("cuda_failure", "Failed: Cuda error csrc/custom_all_reduce.cuh:143 'invalid resource "
     "handle'", {"err": "invalid resource handle"}),
    ("exception", "ptuning/train.sh: torch.distributed.elastic.multiprocessing.api."
     "SignalException: Process 8665 got signal: 1",
     {"type": "torch.distributed.elastic.multiprocessing.api.SignalException"}),
    ("worker_failed", "[2026-03-30 19:24:42,731] torch.distributed.elastic.multiprocessing.api: "
     "[ERROR] failed (exitcode: -9) for binary located at /opt/conda/bin/python3.10 with "
     "local_rank: 0 (process ID: 71)", {"exitcode": -9, "local_rank": 0, "pid": 71}),
]


def classify(line: str) -> list[tuple[str, dict]]:
    ctx = FileContext("example.log", 2026, ref_time=datetime(2026, 11, 22))
    rows = scan_text(io.BytesIO(line.encode() + b"\n"), ctx, [])
    return [(r["kind"], json.loads(r["data"]) if r["data"] else {}) for r in rows]


@pytest.mark.parametrize(("kind", "line", "fields"), EXAMPLES,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(EXAMPLES)])
def test_each_family_becomes_its_event(kind: str, line: str, fields: dict) -> None:
    events = classify(line)
    got = [d for k, d in events if k == kind]
    assert got, f"{kind} not found in {events}"
    for name, value in fields.items():
        assert got[0].get(name) == value, (name, got[0])


#: Kinds whose lines are multi-line blocks or context-dependent, tested elsewhere.
ELSEWHERE = {"traceback": "test_layouts / test_engine (tracebacks)",
             "worker_failed": "test_attribution (torchelastic blocks)",
             "spawn_failed": "rank_crash_spawn scenario", "agent_signal": "scenarios",
             "rank_local_work": "test_rank_local_work", "connect_retry": "scenarios",
             "rank_data_count": "COLL004-ranks-count-batches (a program's own print)",
             "rank_collective_shape": "COLL001-shape-prints-one-rank-odd (a program's print)",
             "rdzv_connection_error": "rule examples", "backend_device_mismatch": "ENV003 example",
             "socket_ifname": "NCCL001 example",
             # docs/messages/catalog.jsonl examples (test_message_catalog) and rule cases
             "gloo_loopback_fallback": "GLOO15", "horovod_stall": "HVD01",
             "horovod_stalled_tensor": "HVD02", "nccl_proxy_peer_closed": "NCCL-PROXY-01",
             "ray_worker_died": "RAY01", "ray_version_mismatch": "RAY02",
             "nccl_build_incompatible": "NCCL-INIT-01", "nccl_net_choice": "NCCL-NET-01..04",
             "native_signal": "UCX01", "ras_op_counts": "NCCL-RAS-01..04",
             "ray_train_worker_failed": "RAY04", "zero3_trace_mismatch": "DS-ZERO3-01",
             "thread_exception": "PY-THREAD-01", "ddp_ready_twice": "DDP06, DDP06b", "gpu_xid": "NVRM01", "cuda_arch_unsupported": "TORCH-ARCH-01",
             "training_end": "PL-FIT-01", "horovod_shut_down": "HVD-SHUT-01",
             "random_run_id": "ELASTIC-RUNID-01", "load_barrier_unfinished": "SGLANG-LOAD-01",
             "serving_watchdog": "SGLANG-WATCHDOG-01",
             "distributed_save": "ACCEL-SAVE-01..02, DS-CKPT-01",
             "usage_error": "PY-ARGPARSE-01", "worker_group_succeeded": "ELASTIC-OK-01",
             "ccl_error": "ONECCL-01",
             "nccl_bind_failed": "NCCL33b", "mpi_tcp_failure": "OMPI-BTL-01..03",
             "workers_out_of_sync": "FAIRSEQ-SYNC-01",
             "gloo_family_mismatch": "GLOO-FAMILY-01",
             "engine_worker_died": "VLLM-WORKER-01..03",
             "mpi_tcp_unreachable": "OMPI-TCP-01", "mpi_remote_host": "OMPI-TCP-02",
             "check_failed": "GLOG-CHECK-01", "k8s_last_state": "K8S-LAST-01",
             "printed_stack": "PY-STACK-01"}


def test_every_kind_has_an_example_here_or_is_tested_elsewhere() -> None:
    kinds = {p.kind for p in PATTERNS}
    covered = {k for k, _, _ in EXAMPLES} | set(ELSEWHERE)
    assert kinds - covered == set()


def test_a_whole_failure_summary_reads_its_signal_as_the_entry() -> None:
    summary = "\n".join([
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "============================================================",
        "train.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2024-11-26_02:04:31",
        "  host      : gpu-7",
        "  rank      : 0 (local_rank: 0)",
        "  exitcode  : -11 (pid: 6421)",
        "  error_file: <N/A>",
        "  traceback : Signal 11 (SIGSEGV) received by PID 6421",
        "============================================================"])
    rows = scan_text(io.BytesIO(summary.encode()), FileContext("x.log", 2024), [])
    kinds = [r["kind"] for r in rows if r["kind"] != "last_line"]
    assert "elastic_failure" in kinds and "worker_signal" not in kinds
