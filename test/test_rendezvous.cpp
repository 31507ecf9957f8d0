/*
 Tests for how data-parallel processes find each other (llmc/rendezvous.h) and
 for the watchdog that ends a process whose peers died (llmc/watchdog.h):
 rank and size from each launcher's environment, a blob handed from rank 0 to
 every other rank over TCP and through a shared file, and one clear error
 (never a hang) when a rank does not come or a phase outlives its deadline.
*/
#include "llmc/rendezvous.h"
#include "llmc/watchdog.h"
#include "test/test.h"

static const char* const launcher_vars[] = {
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE",
    "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "RANK", "WORLD_SIZE", "LOCAL_RANK",
};

static void clear_launcher_env(void) {
    for (size_t i = 0; i < sizeof(launcher_vars) / sizeof(launcher_vars[0]); i++) { unsetenv(launcher_vars[i]); }
}

static void test_process_info(void) {
    clear_launcher_env();
    ProcessInfo p = process_info(-1, -1);
    CHECK(p.rank == 0 && p.size == 1 && p.local_rank == -1, "no launcher: rank %d of %d", p.rank, p.size);
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_LOCALID", "1", 1);
    p = process_info(-1, -1);
    CHECK(p.rank == 5 && p.size == 8 && p.local_rank == 1 && strcmp(p.launcher, "Slurm") == 0,
          "Slurm: rank %d of %d, local %d, %s", p.rank, p.size, p.local_rank, p.launcher);
    // mpirun's variables win over Slurm's (mpirun inside an allocation)
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
    p = process_info(-1, -1);
    CHECK(p.rank == 3 && p.size == 4 && p.local_rank == 3 && strncmp(p.launcher, "mpirun", 6) == 0,
          "Open MPI: rank %d of %d, %s", p.rank, p.size, p.launcher);
    // flags win over everything
    p = process_info(1, 2);
    CHECK(p.rank == 1 && p.size == 2 && strcmp(p.launcher, "flags") == 0, "flags: rank %d of %d", p.rank, p.size);
    clear_launcher_env();
    setenv("RANK", "2", 1);
    setenv("WORLD_SIZE", "3", 1);
    p = process_info(-1, -1);
    CHECK(p.rank == 2 && p.size == 3 && p.local_rank == -1, "RANK/WORLD_SIZE: rank %d of %d", p.rank, p.size);
    clear_launcher_env();
}

static void rank_too_big(const void*) {
    clear_launcher_env();
    setenv("PMI_RANK", "4", 1);
    setenv("PMI_SIZE", "4", 1);
    process_info(-1, -1);
}

static void rank_garbage(const void*) {
    clear_launcher_env();
    setenv("RANK", "x1", 1);
    setenv("WORLD_SIZE", "2", 1);
    process_info(-1, -1);
}

static void flag_rank_out_of_range(const void*) { process_info(2, 2); }
static void flag_rank_missing(const void*) { process_info(-1, 2); }

// ----------------------------------------------------------------------------
// P processes meet; each non-zero rank exits 0 if it received rank 0's blob

typedef struct { char bytes[128]; } Blob;

static Blob make_blob(void) {
    Blob b;
    for (int i = 0; i < 128; i++) { b.bytes[i] = (char)(i * 7 + 3); }
    return b;
}

typedef struct {
    const char* method;  // "tcp" or "file"
    const char* where;   // address or path
    int size;            // processes of the run
    int started;         // how many of them are started (fewer: a missing rank)
    double timeout;
} Meeting;

static void meet(const Meeting* m, int rank) {
    ProcessInfo p = {rank, m->size, -1, "test"};
    Blob b = rank == 0 ? make_blob() : Blob{};
    if (strcmp(m->method, "tcp") == 0) {
        rendezvous_tcp(m->where, &p, &b, sizeof(b), m->timeout);
    } else {
        rendezvous_file(m->where, &p, &b, sizeof(b), m->timeout);
    }
    Blob want = make_blob();
    exit(memcmp(&b, &want, sizeof(b)) == 0 ? 0 : 7);
}

// starts ranks 1..started-1 as children, runs rank 0 as fn's child; returns
// rank 0's status and message; *others_ok: every started rank exited 0
static int run_meeting(const Meeting* m, char* err, size_t errlen, int* others_ok) {
    pid_t pids[16];
    fflush(stdout);
    fflush(stderr);
    for (int r = 1; r < m->started; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            if (freopen("/dev/null", "w", stderr) == NULL) { _exit(99); }
            meet(m, r);
        }
    }
    int rc = run_child([](const void* arg) { meet((const Meeting*)arg, 0); }, m, err, errlen);
    *others_ok = 1;
    for (int r = 1; r < m->started; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        *others_ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    return rc;
}

static void test_meetings(void) {
    char address[64], err[1024];
    // a port of this test's own (the pid spreads concurrent test runs apart)
    snprintf(address, sizeof(address), "127.0.0.1:%d", 20000 + (int)(getpid() % 20000));
    Path file = tmp_path("rendezvous");
    int others_ok;
    Meeting tcp = {"tcp", address, 4, 4, 20};
    int rc = run_meeting(&tcp, err, sizeof(err), &others_ok);
    CHECK(rc == 0 && others_ok, "tcp: 4 processes: rank 0 exit %d (%s), others ok %d", rc, err, others_ok);
    Meeting shared = {"file", file.s, 3, 3, 20};
    rc = run_meeting(&shared, err, sizeof(err), &others_ok);
    CHECK(rc == 0 && others_ok, "file: 3 processes: rank 0 exit %d (%s), others ok %d", rc, err, others_ok);
    CHECK(!file_exists(file.s), "the rendezvous file was left behind");

    // a rank that never comes: rank 0 stops with one line, within the timeout
    Meeting missing = {"tcp", address, 3, 2, 1.5};
    double t0 = now_seconds();
    rc = run_meeting(&missing, err, sizeof(err), &others_ok);
    CHECK(rc == 1 && strstr(err, "only 2 of 3 processes reached") && now_seconds() - t0 < 10,
          "tcp, missing rank: exit %d after %.1f s: %s", rc, now_seconds() - t0, err);
    Meeting missing_file = {"file", file.s, 3, 2, 1.5};
    rc = run_meeting(&missing_file, err, sizeof(err), &others_ok);
    CHECK(rc == 1 && strstr(err, "rank 2 never answered"), "file, missing rank: exit %d: %s", rc, err);
    remove(file.s); // left by the failed meeting, as the message says
    for (int r = 1; r < 3; r++) {
        char ack[256];
        snprintf(ack, sizeof(ack), "%s.ack%d", file.s, r);
        remove(ack);
    }
    // no rank 0: the others give up too
    Meeting no_zero = {"file", file.s, 2, 0, 1};
    rc = run_child([](const void* arg) { meet((const Meeting*)arg, 1); }, &no_zero, err, sizeof(err));
    CHECK(rc == 1 && strstr(err, "rank 1 found no"), "file, no rank 0: exit %d: %s", rc, err);
    // a stale file from an earlier run is refused, not read
    FILE* fp = fopenCheck(file.s, "wb");
    fcloseCheck(fp);
    Meeting stale = {"file", file.s, 2, 1, 1};
    rc = run_child([](const void* arg) { meet((const Meeting*)arg, 0); }, &stale, err, sizeof(err));
    CHECK(rc == 1 && strstr(err, "already exists"), "stale file: exit %d: %s", rc, err);
    remove(file.s);
    Meeting bad_address = {"tcp", "no-port-here", 2, 1, 1};
    rc = run_child([](const void* arg) { meet((const Meeting*)arg, 1); }, &bad_address, err, sizeof(err));
    CHECK(rc == 1 && strstr(err, "is not host:port"), "bad address: exit %d: %s", rc, err);
}

// ----------------------------------------------------------------------------

static void watchdog_fires(const void*) {
    Watchdog w;
    watchdog_start(&w, 1);
    watchdog_arm(&w, 0.3, "rank %d: step %d", 1, 42);
    sleep(5); // stands for a collective whose peer died
    exit(0);
}

static void watchdog_quiet(const void*) {
    Watchdog w;
    watchdog_start(&w, 1);
    for (int i = 0; i < 5; i++) {
        watchdog_arm(&w, 0.3, "step %d", i);
        usleep(100000);
        watchdog_disarm(&w);
    }
    usleep(500000); // disarmed: nothing fires
    watchdog_stop(&w);
    exit(0);
}

// a watchdog that is off never fires
static void watchdog_off(const void*) {
    Watchdog w;
    watchdog_start(&w, 0);
    watchdog_arm(&w, 0.1, "step %d", 1);
    usleep(400000);
    watchdog_disarm(&w);
    watchdog_stop(&w);
    exit(0);
}

static void test_watchdog(void) {
    char err[1024];
    double t0 = now_seconds();
    int rc = run_child(watchdog_fires, NULL, err, sizeof(err));
    CHECK(rc == 1 && strstr(err, "error: rank 1: step 42 did not finish within 0.3 s") && now_seconds() - t0 < 3,
          "armed watchdog: exit %d after %.1f s: %s", rc, now_seconds() - t0, err);
    rc = run_child(watchdog_quiet, NULL, err, sizeof(err));
    CHECK(rc == 0 && err[0] == '\0', "disarmed watchdog fired: exit %d: %s", rc, err);
    rc = run_child(watchdog_off, NULL, err, sizeof(err));
    CHECK(rc == 0 && err[0] == '\0', "a watchdog that is off fired: exit %d: %s", rc, err);
}

int main(void) {
    make_tmp_dir("test_rendezvous");
    test_process_info();
    expect_child_error(rank_too_big, NULL, "PMI_RANK=4 is not below PMI_SIZE=4");
    expect_child_error(rank_garbage, NULL, "RANK='x1' is not a count");
    expect_child_error(flag_rank_out_of_range, NULL, "--process-rank 2 is not in 0..1");
    expect_child_error(flag_rank_missing, NULL, "--num-processes 2 needs --process-rank");
    test_meetings();
    test_watchdog();
    remove_tmp_dir();
    return test_summary("test_rendezvous");
}
