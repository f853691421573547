/* test_scratch.c -- the per-thread scratch buffers (core/base/scratch.h): growth,
 * contents kept while a slot does not grow, one buffer per thread, every
 * buffer given back when its thread exits (scratch_live_bytes; the ASan run
 * of this suite checks the same for leaks), an allocation fault leaving the
 * previous buffer in place, and the users' fallbacks under that fault (an
 * unbounded-cache search answers NC_ENOMEM, then succeeds once the fault
 * is gone, and searches again without allocating). */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "harness.h"
#include "scratch.h"
#include "unbounded_cache.h"

/* n bytes of a pattern that depends on seed and position */
static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31u + seed);
}

static bool intact(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 31u + seed))
            return false;
    return true;
}

/* Growth, the bytes it promises (written whole: ASan would report an
 * overrun), the contents kept by a call that does not grow, alignment. */
TEST(grows_and_keeps)
{
    const nc_scratch_slot s = NC_SCRATCH_DYN_ARENA;
    size_t cap = 1;
    CHECK(scratch_peek(s, &cap) == NULL && cap == 0);   /* this thread has none yet */
    const size_t live0 = scratch_live_bytes();
    unsigned char *a = scratch_get(s, 100);
    CHECK(a != NULL && (uintptr_t)a % 64 == 0);
    if (!a)
        return;
    fill(a, 100, 1);
    CHECK(scratch_live_bytes() == live0 + 100);
    /* smaller and equal requests: the same buffer, contents as left */
    CHECK(scratch_get(s, 40) == a && scratch_get(s, 100) == a && intact(a, 100, 1));
    CHECK(scratch_get(s, 0) == a);   /* 0 counts as 1: non-NULL means success */
    CHECK(scratch_peek(s, &cap) == a && cap == 100);
    unsigned char *b = scratch_get(s, 300000);   /* over the mmap threshold */
    CHECK(b != NULL && (uintptr_t)b % 64 == 0);
    if (!b)
        return;
    fill(b, 300000, 2);
    CHECK(scratch_peek(s, &cap) == b && cap == 300000 && intact(b, 300000, 2));
    CHECK(scratch_live_bytes() == live0 + 300000);
    /* slots are independent */
    unsigned char *c = scratch_get(NC_SCRATCH_DYN_TRACE, 64);
    CHECK(c != NULL && c != b && intact(b, 300000, 2));
    CHECK(scratch_live_bytes() == live0 + 300000 + 64);
}

/* ---- threads ---------------------------------------------------------------- */

typedef struct {
    pthread_barrier_t *bar;
    unsigned seed;
    size_t n;
    unsigned char *got;           /* the thread's buffer */
    bool ok;                      /* its pattern survived the other thread's */
    size_t live_inside;           /* scratch_live_bytes() with its buffers held */
} worker_arg;

/* Both threads take the same slot and write their patterns while the other
 * holds its buffer; then each checks its own. */
static void *worker(void *p)
{
    worker_arg *w = p;
    w->got = scratch_get(NC_SCRATCH_UB_SEARCH, w->n);
    if (w->got)
        fill(w->got, w->n, w->seed);
    pthread_barrier_wait(w->bar);   /* both filled */
    pthread_barrier_wait(w->bar);   /* both looked at the pointers */
    w->ok = w->got && intact(w->got, w->n, w->seed) && scratch_get(NC_SCRATCH_UB_SEARCH, w->n) == w->got;
    return NULL;
}

TEST(one_buffer_per_thread)
{
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 3);
    const size_t live0 = scratch_live_bytes();
    worker_arg w[2] = {{&bar, 5, 4096, NULL, false, 0}, {&bar, 9, 4096, NULL, false, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, worker, &w[i]);
    pthread_barrier_wait(&bar);
    unsigned char *mine = scratch_peek(NC_SCRATCH_UB_SEARCH, NULL);
    CHECK(w[0].got && w[1].got && w[0].got != w[1].got);
    CHECK(mine != w[0].got && mine != w[1].got);   /* NULL, or the main thread's own */
    CHECK(scratch_live_bytes() == live0 + 2 * 4096);
    pthread_barrier_wait(&bar);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    CHECK(w[0].ok && w[1].ok);
    CHECK(scratch_live_bytes() == live0);   /* both given back at exit */
    pthread_barrier_destroy(&bar);
}

/* A thread that takes every slot, and grows one twice. */
static void *all_slots(void *p)
{
    worker_arg *w = p;
    bool ok = true;
    for (int s = 0; s < NC_SCRATCH_NSLOTS; s++)
        ok = ok && scratch_get((nc_scratch_slot)s, w->n * (size_t)(s + 1)) != NULL;
    ok = ok && scratch_get(NC_SCRATCH_UB_SEARCH, 3 * w->n) != NULL;
    w->ok = ok;
    w->live_inside = scratch_live_bytes();
    return NULL;
}

/* Another key's destructor that runs after scratch's (keys are created in
 * order and glibc runs destructors in key order) and takes a buffer again:
 * the thread registers anew and glibc's next destructor round frees it. */
static pthread_key_t late_key;
static void late_destructor(void *p)
{
    worker_arg *w = p;
    w->got = scratch_get(NC_SCRATCH_DYN_TRACE, 777);
}

static void *late_user(void *p)
{
    pthread_setspecific(late_key, p);
    return all_slots(p);
}

TEST(freed_at_thread_exit)
{
    const size_t live0 = scratch_live_bytes();
    worker_arg w = {NULL, 0, 1000, NULL, false, 0};
    pthread_t t;
    pthread_create(&t, NULL, all_slots, &w);
    pthread_join(t, NULL);
    /* 1000 x (1 + 2 + 3) bytes, then the first slot grown to 3000 */
    CHECKF(w.ok && w.live_inside == live0 + 3000 + 2000 + 3000, "%zu held, %zu expected", w.live_inside - live0,
           (size_t)8000);
    CHECK(scratch_live_bytes() == live0);

    (void)scratch_get(NC_SCRATCH_UB_SEARCH, 1);   /* scratch's key exists before late_key */
    const size_t live1 = scratch_live_bytes();
    CHECK(pthread_key_create(&late_key, late_destructor) == 0);
    worker_arg v = {NULL, 0, 500, NULL, false, 0};
    pthread_create(&t, NULL, late_user, &v);
    pthread_join(t, NULL);
    CHECK(v.ok && v.got != NULL);   /* the destructor got its buffer */
    CHECK(scratch_live_bytes() == live1);   /* and it was freed too */
    pthread_key_delete(late_key);
}

/* ---- allocation faults ------------------------------------------------------ */

TEST(failed_growth_keeps_the_old_buffer)
{
    const nc_scratch_slot s = NC_SCRATCH_DYN_TRACE;
    nc_fault_thread(true);
    unsigned char *a = scratch_get(s, 256);
    if (!a) {
        CHECK(a != NULL);
        return;
    }
    size_t cap;
    (void)scratch_peek(s, &cap);
    fill(a, cap, 3);
    const size_t live0 = scratch_live_bytes();
    nc_fault_arm(NC_FAULT_ALLOC, 1, NC_FAULT_PERSIST);
    errno = 0;
    CHECK(scratch_get(s, cap + 1) == NULL && errno == ENOMEM && nc_fault_hits(NC_FAULT_ALLOC) == 1);
    size_t cap2;
    CHECK(scratch_peek(s, &cap2) == a && cap2 == cap && intact(a, cap, 3));
    CHECK(scratch_live_bytes() == live0);
    /* no growth, no allocation: served under the fault */
    CHECK(scratch_get(s, cap) == a && nc_fault_calls(NC_FAULT_ALLOC) == 1 && intact(a, cap, 3));
    nc_fault_disarm();
    unsigned char *b = scratch_get(s, cap + 1);
    CHECK(b != NULL && scratch_live_bytes() == live0 + 1);
    nc_fault_thread(false);
}

/* A thread's first buffer failing: nothing held, and the next call works. */
static void *first_fails(void *p)
{
    worker_arg *w = p;
    nc_fault_thread(true);
    nc_fault_arm(NC_FAULT_ALLOC, 1, 0);
    size_t cap = 1;
    w->ok = scratch_get(NC_SCRATCH_DYN_ARENA, 64) == NULL && errno == ENOMEM &&
            scratch_peek(NC_SCRATCH_DYN_ARENA, &cap) == NULL && cap == 0;
    nc_fault_disarm();
    w->got = scratch_get(NC_SCRATCH_DYN_ARENA, 64);
    nc_fault_thread(false);
    return NULL;
}

TEST(first_buffer_fails)
{
    worker_arg w = {NULL, 0, 0, NULL, false, 0};
    const size_t live0 = scratch_live_bytes();
    pthread_t t;
    pthread_create(&t, NULL, first_fails, &w);
    pthread_join(t, NULL);
    CHECK(w.ok && w.got != NULL);
    CHECK(scratch_live_bytes() == live0);
}

/* ---- a user: the unbounded cache's search buffers --------------------------- */

#define UB_DIM 8
#define UB_N 40
#define UB_K 5

typedef struct {
    nc_unbounded_cache *u;
    float q[UB_DIM];
    int rc_faulted, rc_after, rc_again;
    char err[NC_ERRLEN];
    bool cleared;                 /* the failed search's answer: no neighbours */
    bool same;                    /* the search under the fault, with the buffer held, answers as before */
} search_arg;

/* In a fresh thread (no search buffer yet): the fault fails the buffer's
 * allocation and the search says so; without the fault it searches; with
 * the fault again but the buffer already large enough, nothing is
 * allocated and the answer is the same. */
static void *search_thread(void *p)
{
    search_arg *a = p;
    float d1[UB_K], d2[UB_K];
    int w1[UB_K], w2[UB_K];
    nc_fault_thread(true);
    nc_fault_arm(NC_FAULT_ALLOC, 1, NC_FAULT_PERSIST);
    a->rc_faulted = unbounded_cache_search(a->u, a->q, 1, UB_K, 0, NULL, 0, NC_UB_OPEN, d1, w1, a->err,
                                           sizeof a->err);
    a->cleared = true;
    for (int i = 0; i < UB_K; i++)
        a->cleared = a->cleared && w1[i] == -1;
    nc_fault_disarm();
    char err[NC_ERRLEN];
    a->rc_after = unbounded_cache_search(a->u, a->q, 1, UB_K, 0, NULL, 0, NC_UB_OPEN, d1, w1, err, sizeof err);
    nc_fault_arm(NC_FAULT_ALLOC, 1, NC_FAULT_PERSIST);
    a->rc_again = unbounded_cache_search(a->u, a->q, 1, UB_K, 0, NULL, 0, NC_UB_OPEN, d2, w2, err, sizeof err);
    nc_fault_disarm();
    nc_fault_thread(false);
    a->same = memcmp(d1, d2, sizeof d1) == 0 && memcmp(w1, w2, sizeof w1) == 0;
    return NULL;
}

TEST(search_under_allocation_fault)
{
    nc_unbounded_cache_opts o;
    unbounded_cache_opts_default(&o, UB_DIM);
    o.exact = true;
    search_arg a = {0};
    char err[NC_ERRLEN];
    CHECKF(unbounded_cache_new(&o, NULL, &a.u, err, sizeof err) == NC_OK, "%s", err);
    if (!a.u)
        return;
    float keys[UB_N * UB_DIM];
    int words[UB_N];
    for (int i = 0; i < UB_N; i++) {
        words[i] = i;
        for (int j = 0; j < UB_DIM; j++)
            keys[i * UB_DIM + j] = j ? (float)((i * 7 + j * 3) % 11) : (float)i;   /* distinct keys */
    }
    CHECK(unbounded_cache_add(a.u, keys, words, UB_N, NULL, err, sizeof err) == NC_OK);
    memcpy(a.q, keys + 3 * UB_DIM, sizeof a.q);   /* pair 3's key: its own nearest neighbour */
    pthread_t t;
    pthread_create(&t, NULL, search_thread, &a);
    pthread_join(t, NULL);
    CHECKF(a.rc_faulted == NC_ENOMEM, "rc %d", a.rc_faulted);
    CHECK_STR_CONTAINS(a.err, "search buffers");
    CHECK(a.cleared);
    CHECK(a.rc_after == NC_OK && a.rc_again == NC_OK && a.same);
    /* the answer itself, against the same search on this thread */
    float d[UB_K];
    int w[UB_K];
    CHECK(unbounded_cache_search(a.u, a.q, 1, UB_K, 0, NULL, 0, NC_UB_OPEN, d, w, err, sizeof err) == NC_OK);
    /* d[0] is 0 up to rounding: FAISS may compute |x|^2 + |y|^2 - 2 x.y,
     * |x|^2 <= 39^2 + 7 * 10^2 = 2221, so a few float ulps of that (2e-4
     * each); any other key is at least 1 away */
    CHECK(w[0] == 3 && d[0] < 1e-2f && w[1] != 3 && d[1] >= 1.0f - 1e-2f);
    unbounded_cache_free(a.u);
}

int main(void)
{
    RUN(grows_and_keeps);
    RUN(one_buffer_per_thread);
    RUN(freed_at_thread_exit);
    RUN(failed_growth_keeps_the_old_buffer);
    RUN(first_buffer_fails);
    RUN(search_under_allocation_fault);
    return harness_summary();
}
