/*
 How the processes of a data-parallel run find each other before NCCL starts.

 Each process learns its rank, the number of processes and its GPU on this
 machine from the launcher's environment (mpirun: OMPI_COMM_WORLD_* or
 PMI_*; Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; torchrun-style:
 RANK, WORLD_SIZE, LOCAL_RANK) or from flags. Then rank 0 hands the others
 one small blob (NCCL's unique id) in one of three ways:
 - MPI (when built with MPI and started by mpirun): a broadcast, in the trainer;
 - TCP: rank 0 listens on host:port, each other rank connects and reads it;
 - a file on a filesystem all ranks see: rank 0 writes it atomically, the
   others poll for it and then leave an acknowledgement, and rank 0 removes
   the files once every rank has answered.
 Every wait has a deadline: a rank that never shows up is a one-line error,
 never a hang. Plain C (POSIX sockets), so the CPU tests cover it.
*/
#ifndef LLMC_RENDEZVOUS_H
#define LLMC_RENDEZVOUS_H

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "llmc/utils.h"

typedef struct {
    int rank;        // 0 .. size-1
    int size;        // number of processes
    int local_rank;  // index of this process's GPU on its machine
    const char* launcher; // where rank and size came from, for the log
} ProcessInfo;

static inline void rdv_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// an integer environment variable, or -1 when unset; garbage is an error
static inline int env_int(const char* name) {
    const char* s = getenv(name);
    if (s == NULL || *s == '\0') { return -1; }
    char* end;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v < 0 || v > 1000000) { fatal("environment variable %s='%s' is not a count", name, s); }
    return (int)v;
}

// rank and size from flags (>= 0 when given) or the first launcher whose
// variables are set; a single process when none is
static inline ProcessInfo process_info(int flag_rank, int flag_size) {
    static const struct { const char *name, *rank, *size, *local; } launchers[] = {
        {"mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"mpirun (PMI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
        {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
        {"environment", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    };
    ProcessInfo p = {0, 1, -1, "single process"};
    if (flag_size >= 1) {
        if (flag_rank < 0) { fatal("--num-processes %d needs --process-rank", flag_size); }
        if (flag_rank >= flag_size) { fatal("--process-rank %d is not in 0..%d", flag_rank, flag_size - 1); }
        p.rank = flag_rank;
        p.size = flag_size;
        p.launcher = "flags";
        p.local_rank = env_int("LOCAL_RANK");
    } else {
        for (size_t i = 0; i < sizeof(launchers) / sizeof(launchers[0]); i++) {
            int r = env_int(launchers[i].rank), s = env_int(launchers[i].size);
            if (r < 0 || s < 1) { continue; }
            if (r >= s) { fatal("%s=%d is not below %s=%d", launchers[i].rank, r, launchers[i].size, s); }
            p.rank = r;
            p.size = s;
            p.local_rank = env_int(launchers[i].local);
            p.launcher = launchers[i].name;
            break;
        }
    }
    if (p.local_rank < 0) { p.local_rank = -1; } // the caller picks rank % GPUs
    return p;
}

// ----------------------------------------------------------------------------
// TCP: "host:port"; rank 0 binds the port, the others connect to host

static inline void rdv_split_address(const char* address, char* host, size_t host_len, char* port, size_t port_len) {
    const char* colon = strrchr(address, ':');
    if (colon == NULL || colon == address || colon[1] == '\0' || (size_t)(colon - address) >= host_len ||
        strlen(colon + 1) >= port_len) {
        fatal("rendezvous address '%s' is not host:port", address);
    }
    memcpy(host, address, colon - address);
    host[colon - address] = '\0';
    strcpy(port, colon + 1);
}

// sends or receives exactly n bytes before the deadline; 0 on success
static inline int rdv_transfer(int fd, void* buf, size_t n, int sending, double deadline) {
    char* p = (char*)buf;
    while (n > 0) {
        struct pollfd pfd = {fd, (short)(sending ? POLLOUT : POLLIN), 0};
        int wait_ms = (int)((deadline - now_seconds()) * 1000);
        if (wait_ms <= 0 || poll(&pfd, 1, wait_ms) <= 0) { return -1; }
        ssize_t k = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k <= 0) { return -1; }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

// the blob travels as: magic, bytes, blob; each receiver answers with its rank
#define RDV_MAGIC 0x52445631u

static inline void rendezvous_tcp(const char* address, const ProcessInfo* p, void* blob, size_t bytes, double timeout_s) {
    char host[256], port[32];
    rdv_split_address(address, host, sizeof(host), port, sizeof(port));
    double deadline = now_seconds() + timeout_s;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (p->rank == 0) { hints.ai_flags = AI_PASSIVE; }
    int err = getaddrinfo(p->rank == 0 ? NULL : host, port, &hints, &res);
    if (err != 0) { fatal("rendezvous: cannot resolve %s: %s", address, gai_strerror(err)); }
    if (p->rank == 0) {
        int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
        int one = 1;
        if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
            bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 128) != 0) {
            fatal("rendezvous: rank 0 cannot listen on port %s: %s", port, strerror(errno));
        }
        freeaddrinfo(res);
        uint32_t head[2] = {RDV_MAGIC, (uint32_t)bytes};
        for (int joined = 1; joined < p->size; joined++) {
            struct pollfd pfd = {fd, POLLIN, 0};
            int wait_ms = (int)((deadline - now_seconds()) * 1000);
            if (wait_ms <= 0 || poll(&pfd, 1, wait_ms) <= 0) {
                fatal("rendezvous: only %d of %d processes reached %s within %.0f s", joined, p->size, address, timeout_s);
            }
            int conn = accept(fd, NULL, NULL);
            if (conn < 0) { fatal("rendezvous: accept on %s failed: %s", address, strerror(errno)); }
            int32_t peer = -1;
            if (rdv_transfer(conn, head, sizeof(head), 1, deadline) != 0 || rdv_transfer(conn, blob, bytes, 1, deadline) != 0 ||
                rdv_transfer(conn, &peer, sizeof(peer), 0, deadline) != 0 || peer <= 0 || peer >= p->size) {
                fatal("rendezvous: a process that connected to %s broke off (rank %d)", address, peer);
            }
            close(conn);
        }
        close(fd);
        return;
    }
    // other ranks: rank 0 may not be listening yet, so retry until the deadline
    for (;;) {
        int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
        if (fd < 0) { fatal("rendezvous: socket: %s", strerror(errno)); }
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
            uint32_t head[2] = {0, 0};
            int32_t me = p->rank;
            if (rdv_transfer(fd, head, sizeof(head), 0, deadline) != 0 || head[0] != RDV_MAGIC || head[1] != bytes ||
                rdv_transfer(fd, blob, bytes, 0, deadline) != 0 || rdv_transfer(fd, &me, sizeof(me), 1, deadline) != 0) {
                fatal("rendezvous: %s answered, but not with this program's rendezvous (another job on that port?)", address);
            }
            close(fd);
            freeaddrinfo(res);
            return;
        }
        close(fd);
        if (now_seconds() > deadline) { fatal("rendezvous: rank %d could not reach rank 0 at %s within %.0f s", p->rank, address, timeout_s); }
        rdv_sleep_ms(100);
    }
}

// ----------------------------------------------------------------------------
// shared file: rank 0 writes <path>, rank r > 0 answers with <path>.ack<r>

static inline void rendezvous_file(const char* path, const ProcessInfo* p, void* blob, size_t bytes, double timeout_s) {
    double deadline = now_seconds() + timeout_s;
    char ack[4096];
    if (p->rank == 0) {
        if (access(path, F_OK) == 0) {
            fatal("rendezvous file %s already exists (left by an earlier run?): remove it, or use a path of this job's own", path);
        }
        char tmp[4096];
        FILE* fp = atomic_open(path, tmp, sizeof(tmp));
        uint32_t head[2] = {RDV_MAGIC, (uint32_t)bytes};
        fwriteCheck(head, sizeof(head), 1, fp);
        fwriteCheck(blob, 1, bytes, fp);
        atomic_commit(fp, tmp, path);
        for (int r = 1; r < p->size; r++) {
            snprintf(ack, sizeof(ack), "%s.ack%d", path, r);
            while (access(ack, F_OK) != 0) {
                if (now_seconds() > deadline) { fatal("rendezvous: rank %d never answered through %s within %.0f s", r, path, timeout_s); }
                rdv_sleep_ms(50);
            }
        }
        for (int r = 1; r < p->size; r++) {
            snprintf(ack, sizeof(ack), "%s.ack%d", path, r);
            remove(ack);
        }
        remove(path);
        return;
    }
    for (;;) {
        FILE* fp = fopen(path, "rb");
        if (fp != NULL) {
            uint32_t head[2] = {0, 0};
            int ok = fread(head, sizeof(head), 1, fp) == 1 && head[0] == RDV_MAGIC && head[1] == bytes &&
                     fread(blob, 1, bytes, fp) == bytes;
            fclose(fp);
            if (!ok) { fatal("rendezvous file %s is not this program's (or is damaged)", path); }
            break;
        }
        if (now_seconds() > deadline) { fatal("rendezvous: rank %d found no %s within %.0f s", p->rank, path, timeout_s); }
        rdv_sleep_ms(50);
    }
    snprintf(ack, sizeof(ack), "%s.ack%d", path, p->rank);
    FILE* fp = fopenCheck(ack, "wb");
    fcloseCheck(fp);
}

#endif // LLMC_RENDEZVOUS_H
