/* scratch.c -- per-thread scratch buffers (see scratch.h). */
#include "scratch.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "nc_common.h"

/* A thread's slots. The record itself is thread-local storage (nothing to
 * allocate, so nothing to fail before the first buffer); the pthread key
 * exists only for its destructor, which glibc runs at the thread's exit
 * before that storage goes away. The main thread's buffers are never
 * freed: key destructors do not run at exit(), and the process ends. */
typedef struct {
    void *buf[NC_SCRATCH_NSLOTS];
    size_t cap[NC_SCRATCH_NSLOTS];   /* bytes */
    bool keyed;                      /* pthread_setspecific done */
} scratch_tls;

static __thread scratch_tls tls;
static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int key_rc = -1;
static atomic_size_t live;

static void release(void *p)
{
    scratch_tls *t = p;
    for (int i = 0; i < NC_SCRATCH_NSLOTS; i++) {
        atomic_fetch_sub_explicit(&live, t->cap[i], memory_order_relaxed);
        nc_free(t->buf[i]);
        t->buf[i] = NULL;
        t->cap[i] = 0;
    }
    t->keyed = false;   /* a later destructor's scratch_get registers again */
}

static void key_init(void)
{
    key_rc = pthread_key_create(&key, release);
}

/* Registers the thread's record for the destructor before its first
 * buffer, so that no buffer can outlive its thread. */
static bool keyed(void)
{
    if (tls.keyed)
        return true;
    pthread_once(&key_once, key_init);
    if (key_rc != 0 || pthread_setspecific(key, &tls) != 0) {
        errno = ENOMEM;
        return false;
    }
    tls.keyed = true;
    return true;
}

void *scratch_get(nc_scratch_slot slot, size_t n)
{
    assert(slot >= 0 && slot < NC_SCRATCH_NSLOTS);
    if (n == 0)
        n = 1;
    if (tls.cap[slot] >= n)
        return tls.buf[slot];
    if (!keyed())
        return NULL;
    /* allocated before the old one is freed: a failure leaves the slot as
     * it was; nothing is copied (the contents are undefined after growth) */
    void *p = nc_alloc(n);
    if (!p) {
        errno = ENOMEM;
        return NULL;
    }
    nc_free(tls.buf[slot]);
    atomic_fetch_add_explicit(&live, n - tls.cap[slot], memory_order_relaxed);
    tls.buf[slot] = p;
    tls.cap[slot] = n;
    return p;
}

void *scratch_peek(nc_scratch_slot slot, size_t *cap)
{
    assert(slot >= 0 && slot < NC_SCRATCH_NSLOTS);
    if (cap)
        *cap = tls.cap[slot];
    return tls.buf[slot];
}

size_t scratch_live_bytes(void)
{
    return atomic_load_explicit(&live, memory_order_relaxed);
}
