#!/usr/bin/env python3
"""Where the CPU of a baton-bench run goes, per process and per kind of work.

Record a run with call stacks, then read it with this script:

    perf record -F 999 -g -o perf.data -- target/release/baton-bench --skip-backlog --json bench.json
    python3 tests/bench/profile.py perf.data --deliveries N --hz 999

Every sample is one on-CPU tick of 1/HZ s. A sample belongs to the process whose executable
(baton-hub, baton-node, baton-bench) appears in any sample of its pid; threads of the hub's
writer are told apart by their name (baton-writer). Its kind comes from its leaf frame and, for
kernel time, from the system call its stack goes through (fsync, pwrite, network I/O ...).
`--deliveries` (the deliveries of the profiled passes) turns samples into CPU microseconds per
delivery; without it only shares are printed.
"""

import argparse
import collections
import re
import subprocess
import sys

PROCESSES = ("baton-hub", "baton-node", "baton-bench")

# Leaf frames in user space, first match wins.
USER_KINDS = [
    ("SQLite", re.compile(r"^(sqlite3|pcache1|btree|vdbe|wal|pager|unix(Write|Read|Sync|Lock|Unlock|FileControl)|"
                          r"yy_|keywordCode|balance_|getPage|allocate|releaseMem|moveTo|accessPayload|"
                          r"subjournal|findElement|rusqlite::|ptr_to_le32|btreeReleaseAllCursorPages|"
                          r"applyAffinity|resolveExpr|exprAnalyze|whereLoop|codeCompare|insertCell|dropCell)")),
    ("TLS (rustls, aws-lc)", re.compile(r"(rustls|aws_lc|aesni|_aes|gcm|ghash|sha256|sha512|ecp_nistz|"
                                        r"p256|x25519|bn_|BN_|EVP_|CRYPTO_|chacha|poly1305)", re.I)),
    ("entropy at process start (aws-lc jitter)", re.compile(r"^(jent_|rol64|xoshiro|uint32rotl)")),
    ("HTTP (hyper, h2, axum, reqwest)", re.compile(r"(hyper|h2::|http::|axum|tower|reqwest|httparse|hpack)")),
    ("JSON and validation (serde)", re.compile(r"(serde|json)", re.I)),
    ("async runtime (tokio)", re.compile(r"(tokio|futures|mio::|parking_lot)")),
    ("allocator and memory copies", re.compile(r"(malloc|free|_int_|realloc|memcpy|memmove|memset|memcmp|"
                                               r"__rdl_|alloc::|unlink_chunk|tcache)")),
    ("x509 and certificate checks", re.compile(r"(x509|der_parser|asn1|webpki|rcgen)", re.I)),
    ("locks and threads (libc)", re.compile(r"(pthread|futex|__lll_|sched_yield)")),
]

# System calls a kernel stack can go through, first match wins (outermost frames last).
KERNEL_KINDS = [
    ("disk sync (fsync)", re.compile(r"(do_fsync|__x64_sys_fsync|__x64_sys_fdatasync)")),
    ("file writes (WAL, database)", re.compile(r"(__x64_sys_pwrite64|__x64_sys_write\b|ksys_pwrite|vfs_write.*ext4|ext4_)")),
    ("file reads", re.compile(r"(__x64_sys_pread64|__x64_sys_read\b.*ext4|filemap_read)")),
    ("network I/O (loopback TCP)", re.compile(r"(tcp_|__x64_sys_sendto|__x64_sys_recvfrom|__x64_sys_sendmsg|"
                                             r"__x64_sys_recvmsg|sock_|__x64_sys_writev|__x64_sys_readv|"
                                             r"__x64_sys_write|__x64_sys_read|net_rx_action|loopback)")),
    ("waiting and waking (epoll, futex, scheduler)", re.compile(r"(epoll|futex|schedule|finish_task_switch|"
                                                                 r"try_to_wake_up|__x64_sys_sched_yield)")),
    ("process start and memory mapping", re.compile(r"(execve|mmap|munmap|page_fault|do_fault|clone|exit_mmap|"
                                                   r"__x64_sys_exit|do_group_exit|filemap_map_pages)")),
    ("file locks and metadata", re.compile(r"(fcntl|posix_lock|__x64_sys_openat|__x64_sys_close|statx|newfstat|"
                                          r"__x64_sys_unlink|ftruncate)")),
]


def kind_of(frames):
    """The kind of one sample from its frames (leaf first): (symbol, dso) pairs."""
    if not frames:
        return "unknown"
    sym, dso = frames[0]
    if dso == "[kernel.kallsyms]":
        stack = " ".join(s for s, d in frames if d == "[kernel.kallsyms]")
        for name, pattern in KERNEL_KINDS:
            if pattern.search(stack):
                return "kernel: " + name
        return "kernel: other"
    for name, pattern in USER_KINDS:
        if pattern.search(sym):
            return name
    if dso.endswith(("baton-hub", "baton-node", "baton-bench")):
        return "Baton's own code and inlined library code"
    return "other user space (" + dso.rsplit("/", 1)[-1] + ")"


def samples(path):
    """Yields (comm, pid, tid, frames) for every sample of `perf script` on `path`."""
    out = subprocess.run(
        ["perf", "script", "-i", path, "-F", "comm,pid,tid,ip,sym,dso"],
        check=True, capture_output=True, text=True, errors="replace",
    ).stdout
    head, frames = None, []
    frame = re.compile(r"^\s*[0-9a-f]+\s+(.*?)\s+\(([^)]*)\)\s*$")
    for line in out.splitlines() + [""]:
        if not line.strip():
            if head:
                yield head + (frames,)
            head, frames = None, []
            continue
        if head is None:
            m = re.match(r"^(.*?)\s+(\d+)/(\d+)", line)
            if m:
                head = (m.group(1).strip(), int(m.group(2)), int(m.group(3)))
            continue
        m = frame.match(line)
        if m:
            sym = re.sub(r"\+0x[0-9a-f]+$", "", m.group(1))
            frames.append((sym, m.group(2)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("perf_data")
    ap.add_argument("--hz", type=float, default=999.0, help="the -F frequency of the recording")
    ap.add_argument("--deliveries", type=float, default=0.0, help="deliveries of the profiled passes")
    ap.add_argument("--top", type=int, default=14, help="kinds shown per process")
    args = ap.parse_args()

    rows = list(samples(args.perf_data))
    owner = {}
    for comm, pid, tid, frames in rows:
        for sym, dso in frames:
            base = dso.rsplit("/", 1)[-1]
            if base in PROCESSES:
                owner.setdefault(pid, base)
                break
    counts = collections.defaultdict(collections.Counter)
    for comm, pid, tid, frames in rows:
        proc = owner.get(pid, "other processes")
        if proc == "baton-hub":
            proc = "baton-hub (writer thread)" if comm == "baton-writer" else "baton-hub (other threads)"
        counts[proc][kind_of(frames)] += 1

    total = sum(sum(c.values()) for c in counts.values())
    tick_us = 1e6 / args.hz
    per = (lambda n: f"{n * tick_us / args.deliveries:8.1f} us/delivery") if args.deliveries else (lambda n: "")
    print(f"{total} samples at {args.hz:g} Hz = {total / args.hz:.2f} CPU s")
    for proc, c in sorted(counts.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(c.values())
        print(f"\n{proc}: {100 * n / total:5.1f} % of all samples {per(n)}")
        for kind, k in c.most_common(args.top):
            print(f"  {100 * k / n:5.1f} %  {per(k)}  {kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
