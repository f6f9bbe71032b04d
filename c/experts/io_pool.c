#include "experts/io_pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One pread loop per segment; EINVAL on the O_DIRECT descriptor (a filesystem that takes the
 * open but not the read) retries buffered and switches the pool to buffered reads. */
static void do_read(IoPool *p, IoReq *r) {
    r->err = 0;
    r->got = 0;
    for (int i = 0; i < r->nseg && !r->err; i++) {
        const IoSeg *s = &r->seg[i];
        size_t done = 0;
        int direct;
        __atomic_load(&p->direct_failed, &direct, __ATOMIC_RELAXED);
        int fd = s->fd_direct >= 0 && !direct ? s->fd_direct : s->fd_buf;
        while (done < s->len) {
            ssize_t n = fd == s->fd_direct && p->fake_einval ? (errno = EINVAL, -1)
                                                             : pread(fd, s->dst + done, s->len - done, (off_t)(s->off + done));
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && errno == EINVAL && fd == s->fd_direct) {
                int one = 1;
                __atomic_store(&p->direct_failed, &one, __ATOMIC_RELAXED);
                fd = s->fd_buf;
                continue;
            }
            if (n < 0) {
                r->err = errno;
                break;
            }
            if (n == 0) break; /* end of file */
            done += (size_t)n;
            /* O_DIRECT may return short at the end of the file: the rest is buffered */
            if (fd == s->fd_direct && done < s->len && done % 4096) fd = s->fd_buf;
        }
        if (!r->err && done < s->need) r->err = EIO; /* the file is shorter than its header says */
        r->got += done;
    }
}

static IoReq *take(IoPool *p) {
    IoReq *r = p->head[0];
    int q = 0;
    if (!r && p->ahead_running < p->ahead_max) {
        r = p->head[1];
        q = 1;
    }
    if (!r) return NULL;
    p->head[q] = r->next;
    if (!p->head[q]) p->tail[q] = NULL;
    r->next = NULL;
    r->prio = q;
    return r;
}

static void *worker(void *arg) {
    IoPool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        IoReq *r = take(p);
        if (!r) {
            if (p->stop && !p->head[0] && !p->head[1]) break;
            pthread_cond_wait(&p->work, &p->mu);
            continue;
        }
        r->state = IO_RUNNING;
        if (r->prio) p->ahead_running++;
        if (p->in_flight++ == 0) p->busy_since = now_s();
        pthread_mutex_unlock(&p->mu);
        do_read(p, r);
        pthread_mutex_lock(&p->mu);
        if (r->prio) p->ahead_running--;
        if (--p->in_flight == 0) p->busy_s += now_s() - p->busy_since;
        p->bytes += r->got;
        r->state = IO_DONE;
        pthread_cond_broadcast(&p->done);
        if (p->head[1]) pthread_cond_signal(&p->work); /* a read-ahead may run now */
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int io_pool_start(IoPool *p, int n) {
    *p = (IoPool){0};
    if (n < 1) n = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    p->ahead_max = n / 2 > 0 ? n / 2 : 1;
    const char *hook = getenv("COLI_TEST_DIRECT_EINVAL");
    p->fake_einval = hook && !strcmp(hook, "1");
    p->threads = calloc((size_t)n, sizeof(pthread_t));
    if (!p->threads) return -1;
    for (int i = 0; i < n; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p)) {
            io_pool_stop(p);
            return -1;
        }
        p->n_threads++;
    }
    return 0;
}

void io_pool_stop(IoPool *p) {
    if (!p->threads) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    p->threads = NULL;
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
}

static void push(IoPool *p, IoReq *r, int q) {
    r->next = NULL;
    if (p->tail[q]) p->tail[q]->next = r;
    else p->head[q] = r;
    p->tail[q] = r;
}

void io_submit(IoPool *p, IoReq *r, int prio) {
    pthread_mutex_lock(&p->mu);
    r->state = IO_QUEUED;
    r->prio = prio ? 1 : 0;
    r->err = 0;
    push(p, r, r->prio);
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
}

void io_promote(IoPool *p, IoReq *r) {
    pthread_mutex_lock(&p->mu);
    if (r->state == IO_QUEUED && r->prio == 1) {
        IoReq **pp = &p->head[1], *prev = NULL;
        while (*pp && *pp != r) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = r->next;
            if (p->tail[1] == r) p->tail[1] = prev;
            r->prio = 0;
            push(p, r, 0);
            pthread_cond_signal(&p->work);
        }
    }
    pthread_mutex_unlock(&p->mu);
}

int io_wait(IoPool *p, IoReq *r) {
    pthread_mutex_lock(&p->mu);
    while (r->state == IO_QUEUED || r->state == IO_RUNNING) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return r->err;
}

void io_read_now(IoPool *p, IoReq *r) {
    do_read(p, r);
    pthread_mutex_lock(&p->mu);
    p->bytes += r->got;
    r->state = IO_DONE;
    pthread_mutex_unlock(&p->mu);
}
