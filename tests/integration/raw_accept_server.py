#!/usr/bin/python3
"""A TCP server that accepts its connections with a raw accept4 system call,
as io_uring servers and programs with their own system call wrappers do, so
that no accept() of libc (or of the library) ever returns them; with
--libc, through socket.accept() (libc's accept4) instead. It listens through
libc's listen(), holds every connection open and answers each read with
"ok\\n". Prints "ready" once listening. For test_bypass.py.

    raw_accept_server.py --port 8080 [--bind 127.0.0.1] [--libc]
"""

import argparse
import ctypes
import os
import platform
import socket
import threading

SYS_ACCEPT4 = {"x86_64": 288, "aarch64": 242}[platform.machine()]


def serve(fd):
    with socket.socket(fileno=fd) as conn:
        while conn.recv(4096):
            conn.sendall(b"ok\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--libc", action="store_true")
    args = parser.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.bind, args.port))
    listener.listen(64)
    print("ready", flush=True)
    while True:
        if args.libc:
            conn, _ = listener.accept()
            fd = conn.detach()
        else:
            fd = libc.syscall(ctypes.c_long(SYS_ACCEPT4),
                              ctypes.c_long(listener.fileno()), None, None,
                              ctypes.c_long(os.O_CLOEXEC))
            if fd < 0:
                continue
        threading.Thread(target=serve, args=(fd,), daemon=True).start()


if __name__ == "__main__":
    main()
