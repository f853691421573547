/* scratch.h -- per-thread scratch buffers: room for n bytes that a thread
 * keeps between calls and that is freed when the thread exits.
 *
 * For work buffers too large to allocate on every call: a buffer over
 * malloc's mmap threshold (128 KB by default) is mapped afresh by each
 * malloc and every page faulted in again (the kernel clears it), which cost
 * the unbounded cache's searches 4.9% of a scoring pass. A thread's buffer
 * of a slot only grows, to the largest request it has seen, and is shared
 * by everything that thread runs (a worker serves many sessions), so it
 * must not be held across a call that could use the same slot again.
 *
 *     float *p = scratch_get(NC_SCRATCH_DYN_ARENA, n * sizeof(float));
 *     if (!p) return NC_ENOMEM;   // the slot keeps its previous buffer
 *
 * One pthread key and one thread-exit destructor serve every slot
 * (docs/threads.md, "Thread-local state"). Buffers are 64-byte aligned and
 * allocated through nc_alloc, so allocation faults (fault.h) reach them. */
#ifndef NC_SCRATCH_H
#define NC_SCRATCH_H

#include <stddef.h>

/* The users, one slot each: a thread holds at most one buffer per slot. */
typedef enum {
    NC_SCRATCH_UB_SEARCH = 0,     /* unbounded_cache.c: a search's ids and distances */
    NC_SCRATCH_DYN_ARENA,         /* dyneval.c: a segment's activations, backward buffers, gradient */
    NC_SCRATCH_DYN_TRACE,         /* dyneval.c: the thread's recorded scoring pass */
    NC_SCRATCH_NSLOTS
} nc_scratch_slot;

/* The calling thread's buffer of slot with room for at least n bytes (n 0
 * counts as 1), or NULL when it had to grow and the allocation failed:
 * errno ENOMEM, and the slot keeps its previous buffer, valid and unchanged
 * (scratch_peek). Contents: undefined after a call that grew the buffer
 * (nothing is copied), otherwise as this thread last left them. The buffer
 * belongs to the slot: valid until the thread's next scratch_get of that
 * slot that grows it, or the thread's exit; never freed by the caller. */
void *scratch_get(nc_scratch_slot slot, size_t n);

/* The calling thread's current buffer of slot without growing it, or NULL
 * if it has none; *cap (if cap) its size in bytes, 0 without one. */
void *scratch_peek(nc_scratch_slot slot, size_t *cap);

/* Bytes held in scratch buffers by all threads of the process (what the
 * thread-exit destructor gives back is subtracted when it runs). */
size_t scratch_live_bytes(void);

#endif
