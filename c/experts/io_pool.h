/* A bounded pool of reader threads (pthreads, outside the OpenMP compute team) that fills
 * expert slots with pread. Two queues: demand reads (a layer waits for them) always go first;
 * read-ahead reads take at most half the threads, so a demand read never waits behind more
 * than the read-ahead already in flight. A request may be promoted from read-ahead to demand
 * while it is still queued. */
#ifndef COLI_IO_POOL_H
#define COLI_IO_POOL_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define IO_MAX_SEGS 3

typedef enum { IO_IDLE = 0, IO_QUEUED, IO_RUNNING, IO_DONE } IoState;

/* One segment: bytes [off, off + len) of a file land at dst. With O_DIRECT, off, len and dst
 * are multiples of 4096 (the caller reads the enclosing aligned range); need is how many of
 * them must arrive (a range that ends at the end of the file comes back short). */
typedef struct {
    int fd_direct, fd_buf; /* fd_direct < 0: buffered only */
    uint64_t off;
    size_t len, need;
    unsigned char *dst;
} IoSeg;

typedef struct IoReq {
    IoSeg seg[IO_MAX_SEGS];
    int nseg;
    int prio;      /* 0 demand, 1 read-ahead */
    IoState state; /* under the pool's lock */
    int err;       /* errno of a failed read, 0 ok */
    size_t got;    /* bytes read */
    struct IoReq *next;
} IoReq;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_t *threads;
    int n_threads, stop, ahead_running, ahead_max, in_flight;
    IoReq *head[2], *tail[2];
    int direct_failed; /* a read met EINVAL with O_DIRECT: the pool reads buffered from then on */
    int fake_einval;   /* test hook COLI_TEST_DIRECT_EINVAL=1: every O_DIRECT read fails with EINVAL */
    double busy_since; /* seconds, when in_flight went above 0 */
    double busy_s;     /* time with at least one read in flight */
    uint64_t bytes;    /* bytes read */
} IoPool;

/* 0 ok, -1 (threads could not start). */
int io_pool_start(IoPool *p, int n_threads);
/* Lets queued and running reads finish, then joins the threads. */
void io_pool_stop(IoPool *p);
void io_submit(IoPool *p, IoReq *r, int prio);
/* A queued read-ahead becomes a demand read (no effect once it runs). */
void io_promote(IoPool *p, IoReq *r);
/* Waits until r is done; returns r->err. */
int io_wait(IoPool *p, IoReq *r);
/* Reads one request in the calling thread (start-up pinning, tests). */
void io_read_now(IoPool *p, IoReq *r);

#endif
