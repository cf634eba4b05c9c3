/*
 * vmm_predict.c - which rebuild follows which (pure C, no CUDA), so that a
 * reserve made before its imports (PyTorch's order) can be handed the kept
 * range the coming rebuild will map.
 *
 * A rebuild is named by what it maps, not where: its key sums a mix of each
 * (offset in its reservation, imported allocation) it mapped, so it is the
 * same wherever its range lies and whatever order the maps came in. A
 * thread's history holds its last rebuild's key, how many times in a row it
 * came, and the key before that run; the table maps that context (and the
 * last key alone, for a context not seen yet) to the key that came next last
 * time. The key before the run tells apart orders that pass one rebuild going
 * two ways (reversed every other step) and the run length the repeats of one
 * rebuild (tensors sharing one chunk, two engines served in turn); a wrong
 * successor is corrected by the next rebuild, so a miss heals there.
 */
#include <stdlib.h>
#include <string.h>

#include "vmm_table.h"

#define MIN_SLOTS 256
#define MAX_SLOTS 65536 /* past half of this a new context overwrites its home slot */
#define MAX_PROBES 32   /* half full at most: chains stay short */

struct ipcc_vmm_successor {
    struct ipcc_vmm_history context; /* run 0: the last key alone */
    uint64_t next;                   /* 0: an empty slot */
};

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

/* The key of a rebuild after one more mapping of handle at offset. Never 0. */
uint64_t ipcc_vmm_rebuild_key(uint64_t key, uint64_t offset, uint64_t handle)
{
    uint64_t k = key + mix(mix(offset) ^ handle);
    return k ? k : 1;
}

static size_t slot_of(const struct ipcc_vmm_predict *p, const struct ipcc_vmm_history *c)
{
    return (size_t)(mix(mix(c->before + c->run) ^ c->last) & (p->cap - 1));
}

static int same_context(const struct ipcc_vmm_history *a, const struct ipcc_vmm_history *b)
{
    return a->last == b->last && a->before == b->before && a->run == b->run;
}

/* The slot holding context c, or the empty one where it would go. */
static struct ipcc_vmm_successor *find(const struct ipcc_vmm_predict *p,
                                       const struct ipcc_vmm_history *c)
{
    for (size_t i = slot_of(p, c), probes = 0; probes < p->cap && probes < MAX_PROBES;
         i = (i + 1) & (p->cap - 1), probes++) {
        struct ipcc_vmm_successor *s = &p->slots[i];
        if (!s->next || same_context(&s->context, c))
            return s;
    }
    return NULL;
}

/* Doubles the table (half full at most); 0, or -1 when it cannot. */
static int grow(struct ipcc_vmm_predict *p)
{
    size_t cap = p->cap ? p->cap * 2 : MIN_SLOTS;
    if (cap > MAX_SLOTS)
        return -1;
    struct ipcc_vmm_successor *slots = ipcc_mem_calloc(cap, sizeof(*slots));
    if (!slots)
        return -1;
    struct ipcc_vmm_predict bigger = { slots, cap, 0 };
    for (size_t i = 0; i < p->cap; i++)
        if (p->slots[i].next)
            *find(&bigger, &p->slots[i].context) = p->slots[i];
    bigger.n = p->n;
    ipcc_mem_free(p->slots);
    *p = bigger;
    return 0;
}

static void remember(struct ipcc_vmm_predict *p, const struct ipcc_vmm_history *c, uint64_t next)
{
    int full = (p->n + 1) * 2 > p->cap && grow(p) < 0;
    if (!p->cap)
        return; /* no memory: nothing predicted, every reserve as without us */
    struct ipcc_vmm_successor *s = find(p, c);
    if (!s || (full && !s->next)) /* at the largest size: the home slot's successor goes */
        s = &p->slots[slot_of(p, c)];
    else if (!s->next)
        p->n++;
    *s = (struct ipcc_vmm_successor){ *c, next };
}

/* The last key of h alone, as a context. */
static struct ipcc_vmm_history alone(const struct ipcc_vmm_history *h)
{
    return (struct ipcc_vmm_history){ 0, h->last, 0 };
}

/* The rebuild of key next just followed h's; h moves on to it. */
void ipcc_vmm_predict_learn(struct ipcc_vmm_predict *p, struct ipcc_vmm_history *h, uint64_t next)
{
    if (!next)
        return;
    if (h->last) {
        struct ipcc_vmm_history last = alone(h);
        remember(p, h, next);
        remember(p, &last, next);
    }
    if (next == h->last && h->run < UINT32_MAX) {
        h->run++;
    } else if (next != h->last) {
        h->before = h->last;
        h->last = next;
        h->run = 1;
    }
}

static uint64_t successor(const struct ipcc_vmm_predict *p, const struct ipcc_vmm_history *c)
{
    const struct ipcc_vmm_successor *s = p->cap ? find(p, c) : NULL;
    return s ? s->next : 0;
}

/* The key that followed h's context last time, or, for a context not seen
 * yet, the one that followed its last key alone; 0 if none. Not the latter
 * when the former's range is gone: in an order passing a rebuild two ways
 * that would always be the other way's, and the range lost to it each time
 * would be the one the other way needs next. */
uint64_t ipcc_vmm_predict_next(const struct ipcc_vmm_predict *p, const struct ipcc_vmm_history *h)
{
    if (!h->last)
        return 0;
    struct ipcc_vmm_history last = alone(h);
    uint64_t whole = successor(p, h);
    return whole ? whole : successor(p, &last);
}

void ipcc_vmm_predict_clear(struct ipcc_vmm_predict *p)
{
    ipcc_mem_free(p->slots);
    memset(p, 0, sizeof(*p));
}
