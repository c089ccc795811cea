/* memslice.scheduler_extender.index._nameids: node name -> node id for the extender's memo, and the reads by ids
 * that a filter and a prioritize of every node make (scheduler_extender/index/nameids.py is the interface and
 * holds the pure-Python reference these must agree with; tests/extender/test_nameids.py checks that they do).
 *
 * Why native (benchmarks/README.md, "All names per filter, natively"): kube-scheduler may send all 5,000
 * names of a cluster in every filter. In Python each name costs a dict lookup that reaches three scattered
 * objects (the dict entry, the key string, the id's int), and each read by ids a generic getitem call; a
 * filter + prioritize of 5,000 names spent 0.6 ms there. Here a name is hashed from its bytes and found in
 * one compact table (16 bytes a slot, the names' bytes side by side in one arena), and ids are packed
 * uint32s that the reads index directly.
 *
 * Ids travel as bytes objects of native-endian uint32 (`Ids` in nameids.py). Every function holds the GIL
 * throughout and calls no Python code, so the lists it reads cannot change under it. Nothing here trusts
 * its input: a name that is not an exact ASCII str is "not found" (the memo's Python path takes it), an id
 * outside the table raises IndexError, and every size is checked before it is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* A slot of the table; hash 0 marks it empty (hashes are made non-zero). */
typedef struct {
    uint32_t hash;
    uint32_t id;
    uint32_t off; /* the name's bytes: arena[off, off + len) */
    uint32_t len;
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t mask;   /* slots - 1 (a power of two minus one) */
    size_t used;   /* names held */
    char *arena;
    size_t arena_len, arena_cap, arena_dead; /* bytes written, allocated, and belonging to discarded names */
    uint64_t seed;
} NameIndex;

#define MIN_SLOTS 64
#define MAX_BYTES 0xFFFFFFF0u /* offsets and lengths are uint32 */

static PyObject *index_set(PyObject *self, PyObject *args);
static PyObject *index_discard(PyObject *self, PyObject *name);
static PyObject *index_ids(PyObject *self, PyObject *names);
static PyObject *index_ids_json(PyObject *self, PyObject *args);
static PyObject *nameids_take(PyObject *module, PyObject *args);
static PyObject *nameids_gather(PyObject *module, PyObject *args);
static PyObject *nameids_select(PyObject *module, PyObject *args);
static PyObject *nameids_join(PyObject *module, PyObject *args);
static PyObject *nameids_same(PyObject *module, PyObject *args);
static PyObject *nameids_hosts_json(PyObject *module, PyObject *args);
static PyObject *nameids_span_fill(PyObject *module, PyObject *args);
static PyObject *nameids_shared_fill(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
static PyObject *nameids_filter_answer(PyObject *module, PyObject *args);
static PyObject *nameids_span_scores(PyObject *module, PyObject *args);
static PyObject *span_result(PyObject *out, int ok);
static int span_search(PyObject *search, Py_ssize_t k, long gpus, int spread, PyObject **out);
static PyObject *nameids_span_scores_each(PyObject *module, PyObject *args);
static PyObject *nameids_name_hash(PyObject *module, PyObject *args);
static PyObject *span_closest(PyObject *levels, PyObject *by_mask, PyObject *key, uint64_t mask);
PyMODINIT_FUNC PyInit__nameids(void);

/* The helpers of the per-name loops (each runs 5,000 times per verb with all names: a call's own cost was
 * 5-10 instructions of their 15-50) are inlined where the compiler allows. */
#if defined(__GNUC__)
#define HOT static inline __attribute__((always_inline))
#else
#define HOT static inline
#endif

/* MEMSLICE_NAMES_PORTABLE builds the word-at-a-time path alone, as on a CPU without SSE2 (aarch64): the tests build
 * it too (tests/extender/test_nameids.py), so both paths answer what the Python reference answers. */
#if defined(__SSE2__) && defined(__x86_64__) && !defined(MEMSLICE_NAMES_PORTABLE)
#define NAMES_SSE2 1
/* The 16 bytes at p (unaligned). */
HOT __m128i load16(const char *p) {
    return _mm_loadu_si128((const __m128i *)(const void *)p);
}

/* A bit per byte of v that ends a plain name (see plain_run_end): a quote, a backslash, a control byte or one
 * >= 0x7F. The signed compare below 0x20 flags the control bytes and every byte >= 0x80 (negative as signed). */
HOT unsigned stop_mask(__m128i v) {
    __m128i quote = _mm_cmpeq_epi8(v, _mm_set1_epi8('"')), bslash = _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'));
    __m128i low = _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)), del = _mm_cmpeq_epi8(v, _mm_set1_epi8(0x7F));
    return (unsigned)_mm_movemask_epi8(_mm_or_si128(_mm_or_si128(quote, bslash), _mm_or_si128(low, del)));
}

/* A name of 0-15 bytes at p whose closing quote is within the 16 bytes there (end - p >= 16): its length, the
 * 16 bytes in *v; -1 when the 16 bytes hold no stop byte (a longer name: the general path reads it) or the
 * first one is not a quote (no plain name: the caller refuses, as the general path would). Why: a node name
 * is read once, checked, hashed and copied from this one load (benchmarks/README.md, issue 39, fifth pass). */
HOT int short_name(const char *p, __m128i *v, int *refused) {
    *v = load16(p);
    unsigned stop = stop_mask(*v);
    if (!stop)
        return -1;
    int k = __builtin_ctz(stop);
    *refused = p[k] != '"';
    return k;
}
#else
#define NAMES_SSE2 0
#endif

/* Where a plain name's bytes end, from p: the first byte that is a quote, a backslash, a control byte (< 0x20) or
 * one >= 0x7F (the name's closing quote, or what makes it no plain name); `end` when there is none. Why eight
 * bytes at a time: every name of a 5,000-name filter is checked twice per pod (filter's lookups, prioritize's
 * answer), byte by byte ~8 instructions each (benchmarks/README.md, "Where each pod's time goes"); a word with
 * none of those bytes is passed in a dozen. Each test flags every byte that qualifies, and may flag bytes above
 * (later in memory) a flagged one, never one below: borrows and carries run upwards from a byte that
 * qualifies. So the lowest flag of a little-endian word is the first byte that ends the name; elsewhere, and
 * for the last bytes of the buffer, byte by byte. With SSE2, sixteen bytes at a time first (exact per byte, no
 * carries: 39 -> ~15 instructions a name of 10 bytes). Reads stay below `end`. */
HOT const char *plain_run_end(const char *p, const char *end) {
#if NAMES_SSE2
    while (end - p >= 16) {
        unsigned mask = stop_mask(load16(p));
        if (mask)
            return p + __builtin_ctz(mask);
        p += 16;
    }
#endif
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    while (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t q = w ^ (ones * (uint64_t)'"'), b = w ^ (ones * (uint64_t)'\\');
        uint64_t stop = ((q - ones) & ~q)               /* a quote */
                        | ((b - ones) & ~b)             /* a backslash */
                        | ((w - ones * 0x20u) & ~w)     /* a byte below 0x20 */
                        | ((w + ones) | w);             /* a byte above 0x7E */
        if (stop & highs) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            return p + (__builtin_ctzll(stop & highs) >> 3);
#else
            break;
#endif
        }
        p += 8;
    }
    for (; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x7F)
            return p;
    }
    return end;
}

/* The n bytes at p copied to o; where they end there. Why not memcpy: a node name is ~10 bytes, and a libc call
 * per name (its size dispatch) cost more than the copy, 5,000 times per prioritize (callgrind). */
HOT char *copy_name(char *o, const char *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        memcpy(o + i, p + i, 8); /* a constant size: one load and one store */
    if (i < n && n >= 8) {       /* the last 1-7 bytes: the 8 ending there again (the first of them are copied) */
        memcpy(o + n - 8, p + n - 8, 8);
        return o + n;
    }
    for (; i < n; i++)
        o[i] = p[i];
    return o + n;
}

/* Are the n bytes at a and at b the same? Why not memcmp: it is asked once per name looked up (a held name's
 * bytes against the request's), ~10 bytes, and the libc call and its size dispatch cost more than the compare
 * (callgrind: 65 instructions a lookup with it). Eight bytes at a time, the last 1-7 as the 8 ending there. */
HOT int same_bytes(const char *a, const char *b, size_t n) {
    uint64_t x, y;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        if (x != y)
            return 0;
    }
    if (i == n)
        return 1;
    if (n >= 8) {
        memcpy(&x, a + n - 8, 8);
        memcpy(&y, b + n - 8, 8);
        return x == y;
    }
    for (; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

/* The last round of hash_bytes: the last 0-7 bytes `w` mixed in, the 32-bit hash (never 0: 0 marks an empty slot). */
HOT uint32_t hash_end(uint64_t h, uint64_t w) {
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    uint32_t out = (uint32_t)h;
    return out ? out : 1;
}

/* Why seeded: the names come from Node objects, and a hash an outsider can predict would let chosen names
 * pile into one probe run. The seed is the caller's (random per process); the mixing is two rounds of
 * multiply-xorshift over 8-byte words, enough to spread node names that differ in a digit or two. */
HOT uint32_t hash_bytes(uint64_t seed, const char *p, size_t n) {
    const size_t total = n;
    uint64_t h = seed ^ ((uint64_t)n * 0x9E3779B97F4A7C15ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (n > 0 && total >= 8) {                    /* a name of 8 bytes or more: its last 1-7 bytes are the top */
        memcpy(&w, p + n - 8, 8);                /* of the 8 ending there, shifted down (the same w, one load) */
        w >>= 8 * (8 - n);
        n = 0;
    }
#endif
    for (size_t i = 0; i < n; i++) /* the last 0-7 bytes: inline, not a call to memcpy per name */
        w |= (uint64_t)(unsigned char)p[i] << (8 * i);
    return hash_end(h, w);
}

#if NAMES_SSE2
/* hash_bytes of the first n bytes (0-15) of v, from the register (the same words, the same hash). */
HOT uint32_t hash_short(uint64_t seed, __m128i v, size_t n) {
    uint64_t lo = (uint64_t)_mm_cvtsi128_si64(v), hi = (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(v, v));
    uint64_t h = seed ^ ((uint64_t)n * 0x9E3779B97F4A7C15ull), w = 0;
    if (n >= 8) {
        h = (h ^ lo) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        if (n > 8)
            w = hi & (~0ull >> (8 * (16 - n)));
    } else if (n > 0) {
        w = lo & (~0ull >> (8 * (8 - n)));
    }
    return hash_end(h, w);
}
#endif

/* Why ASCII only: a name's bytes are then its characters, read in place with no conversion, and every valid
 * node name (a DNS subdomain) is ASCII. Anything else is simply not held here. */
static const char *ascii_name(PyObject *name, size_t *len) {
    if (!PyUnicode_CheckExact(name) || !PyUnicode_IS_COMPACT_ASCII(name))
        return NULL;
    *len = (size_t)PyUnicode_GET_LENGTH(name);
    return (const char *)PyUnicode_DATA(name);
}

/* The slot holding this name, or the empty slot where its probe run ends. */
HOT Slot *find_slot(const NameIndex *ix, const char *p, size_t n, uint32_t h) {
    for (size_t i = h & ix->mask;; i = (i + 1) & ix->mask) {
        Slot *s = &ix->slots[i];
        if (s->hash == 0 || (s->hash == h && s->len == n && same_bytes(ix->arena + s->off, p, n)))
            return s;
    }
}

/* Why one function for growth and compaction: both rebuild the table from the live names, into `nslots`
 * slots and a fresh arena holding only those names' bytes (discarded names leave dead bytes behind). */
static int rebuild(NameIndex *ix, size_t nslots) {
    size_t live = ix->arena_len - ix->arena_dead;
    size_t cap = live < 4096 ? 4096 : live * 2;
    if (cap > MAX_BYTES)
        cap = live > MAX_BYTES ? live : MAX_BYTES;
    Slot *slots = PyMem_Calloc(nslots, sizeof(Slot));
    char *arena = PyMem_Malloc(cap);
    if (slots == NULL || arena == NULL) {
        PyMem_Free(slots);
        PyMem_Free(arena);
        PyErr_NoMemory();
        return -1;
    }
    size_t len = 0;
    for (size_t i = 0; ix->slots != NULL && i <= ix->mask; i++) {
        const Slot *s = &ix->slots[i];
        if (s->hash == 0)
            continue;
        size_t j = s->hash & (nslots - 1);
        while (slots[j].hash != 0)
            j = (j + 1) & (nslots - 1);
        memcpy(arena + len, ix->arena + s->off, s->len);
        slots[j] = (Slot){s->hash, s->id, (uint32_t)len, s->len};
        len += s->len;
    }
    PyMem_Free(ix->slots);
    PyMem_Free(ix->arena);
    ix->slots = slots;
    ix->mask = nslots - 1;
    ix->arena = arena;
    ix->arena_len = len;
    ix->arena_cap = cap;
    ix->arena_dead = 0;
    return 0;
}

/* NameIndex(seed): an empty index; the seed keys the hash (see hash_bytes). */
static int index_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    NameIndex *ix = (NameIndex *)self;
    static char *kw[] = {"seed", NULL};
    unsigned long long seed;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "K", kw, &seed))
        return -1;
    PyMem_Free(ix->slots);
    PyMem_Free(ix->arena);
    *ix = (NameIndex){.ob_base = ix->ob_base, .seed = seed};
    return rebuild(ix, MIN_SLOTS);
}

/* Why a dealloc: the table and the arena are PyMem blocks the object owns (it holds no Python objects, so it
 * needs no garbage-collector support). */
static void index_dealloc(PyObject *self) {
    NameIndex *ix = (NameIndex *)self;
    PyMem_Free(ix->slots);
    PyMem_Free(ix->arena);
    Py_TYPE(self)->tp_free(self);
}

/* Why ensure_init: a NameIndex made with __new__ alone (never __init__) has no table; every method checks. */
static int ensure_init(NameIndex *ix) {
    if (ix->slots == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "NameIndex used before __init__");
        return -1;
    }
    return 0;
}

/* set(name, id): hold name -> id (replacing its id if held). A name that is not an exact ASCII str is not
 * held (ids() then never finds it, and the memo's Python path answers for it). */
static PyObject *index_set(PyObject *self, PyObject *args) {
    NameIndex *ix = (NameIndex *)self;
    PyObject *name, *id_obj;
    if (!PyArg_ParseTuple(args, "OO!", &name, &PyLong_Type, &id_obj) || ensure_init(ix) < 0)
        return NULL;
    unsigned long id = PyLong_AsUnsignedLong(id_obj); /* OverflowError when negative or too large */
    if (id == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (id > 0xFFFFFFFFul) {
        PyErr_Format(PyExc_OverflowError, "node id %lu does not fit in 32 bits", id);
        return NULL;
    }
    size_t n = 0;
    const char *p = ascii_name(name, &n);
    if (p == NULL)
        Py_RETURN_NONE;
    if (n > MAX_BYTES - ix->arena_len) {
        PyErr_SetString(PyExc_OverflowError, "node names exceed the index's 4 GiB arena");
        return NULL;
    }
    uint32_t h = hash_bytes(ix->seed, p, n);
    Slot *s = find_slot(ix, p, n, h);
    if (s->hash != 0) {
        s->id = (uint32_t)id;
        Py_RETURN_NONE;
    }
    if ((ix->used + 1) * 2 > ix->mask + 1 || ix->arena_len + n > ix->arena_cap) {
        size_t nslots = ix->mask + 1;
        while ((ix->used + 1) * 2 > nslots)
            nslots *= 2;
        if (rebuild(ix, nslots) < 0)
            return NULL;
        if (ix->arena_len + n > ix->arena_cap) { /* live names fill the new arena: grow it */
            size_t cap = (ix->arena_len + n) * 2;
            char *arena = PyMem_Realloc(ix->arena, cap < MAX_BYTES ? cap : MAX_BYTES);
            if (arena == NULL)
                return PyErr_NoMemory();
            ix->arena = arena;
            ix->arena_cap = cap < MAX_BYTES ? cap : MAX_BYTES;
        }
        s = find_slot(ix, p, n, h);
    }
    memcpy(ix->arena + ix->arena_len, p, n);
    *s = (Slot){h, (uint32_t)id, (uint32_t)ix->arena_len, (uint32_t)n};
    ix->arena_len += n;
    ix->used++;
    Py_RETURN_NONE;
}

/* discard(name): forget the name if held. Linear probing allows a true delete: the slots after it in its
 * run move back into the gap when their home is at or before it, so no tombstone ever slows a lookup. */
static PyObject *index_discard(PyObject *self, PyObject *name) {
    NameIndex *ix = (NameIndex *)self;
    if (ensure_init(ix) < 0)
        return NULL;
    size_t n = 0;
    const char *p = ascii_name(name, &n);
    if (p == NULL)
        Py_RETURN_NONE;
    Slot *s = find_slot(ix, p, n, hash_bytes(ix->seed, p, n));
    if (s->hash == 0)
        Py_RETURN_NONE;
    ix->arena_dead += s->len;
    ix->used--;
    size_t gap = (size_t)(s - ix->slots);
    for (size_t j = (gap + 1) & ix->mask; ix->slots[j].hash != 0; j = (j + 1) & ix->mask) {
        size_t home = ix->slots[j].hash & ix->mask;
        /* move j into the gap unless its home lies cyclically in (gap, j] */
        if (((j - home) & ix->mask) >= ((j - gap) & ix->mask)) {
            ix->slots[gap] = ix->slots[j];
            gap = j;
        }
    }
    ix->slots[gap] = (Slot){0, 0, 0, 0};
    if (ix->arena_dead > 4096 && ix->arena_dead * 2 > ix->arena_len && rebuild(ix, ix->mask + 1) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ids(names): every name's id, packed, when `names` is a list and every item a held name; else None (an
 * unknown name, an item that is not an exact ASCII str: the caller's Python path decides about those).
 * Why in batches of three passes: a lookup is two memory reads that miss the caches on a busy machine (its
 * slot, then the name's bytes in the arena), and one after another they wait for each miss in turn. Hashing
 * a batch first and prefetching every slot, then every arena entry, lets the misses of a batch overlap. */
static PyObject *index_ids(PyObject *self, PyObject *names) {
    enum { BATCH = 32 };
    NameIndex *ix = (NameIndex *)self;
    if (ensure_init(ix) < 0)
        return NULL;
    if (!PyList_Check(names))
        Py_RETURN_NONE;
    Py_ssize_t count = PyList_GET_SIZE(names);
    if (count > PY_SSIZE_T_MAX / 4)
        return PyErr_NoMemory();
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * 4);
    if (out == NULL)
        return NULL;
    uint32_t *ids = (uint32_t *)PyBytes_AS_STRING(out);
    uint32_t hashes[BATCH];
    const char *bytes[BATCH];
    size_t lens[BATCH];
    for (Py_ssize_t base = 0; base < count; base += BATCH) {
        Py_ssize_t m = count - base < BATCH ? count - base : BATCH;
        for (Py_ssize_t j = 0; j < m; j++) {
            bytes[j] = ascii_name(PyList_GET_ITEM(names, base + j), &lens[j]);
            if (bytes[j] == NULL)
                goto none;
            hashes[j] = hash_bytes(ix->seed, bytes[j], lens[j]);
            __builtin_prefetch(&ix->slots[hashes[j] & ix->mask]);
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            const Slot *s = &ix->slots[hashes[j] & ix->mask];
            if (s->hash == hashes[j])
                __builtin_prefetch(ix->arena + s->off);
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            const Slot *s = find_slot(ix, bytes[j], lens[j], hashes[j]);
            if (s->hash == 0)
                goto none;
            ids[base + j] = s->id;
        }
    }
    return out;
none:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* Where the JSON whitespace from p ends. Why: JSON allows it around every token, and a writer other than
 * kube-scheduler's (which writes none) may put it there. */
HOT const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Past a string's closing quote at p: onto the next element's `"` after a `,`, or onto the `]`; NULL for
 * anything else. Why one place: both array walks (next_name, hosts_json) must refuse the same non-JSON. */
HOT const char *after_string(const char *p, const char *end) {
    if (end - p > 2 && p[1] == ',' && p[2] == '"') /* the usual: no whitespace (as kube-scheduler writes it) */
        return p + 2;
    p = skip_ws(p + 1, end);
    if (p < end && *p == ',') {
        p = skip_ws(p + 1, end);
        return p < end && *p == '"' ? p : NULL; /* a trailing comma is not JSON */
    }
    return p < end && *p == ']' ? p : NULL;
}

/* The next name of a JSON array of plain strings: on `"` at *pp, the bytes up to the closing quote (every one
 * printable ASCII, no backslash), *pp moved past the following `,` or onto the `]`; NULL for anything else.
 * Why so strict: a name with an escape or a non-ASCII byte is no node's name as this index holds it, and the
 * caller then decodes the whole request with a real JSON parser, which judges it. */
HOT const char *next_name(const char **pp, const char *end, size_t *len, uint64_t seed, uint32_t *hash) {
    const char *p = *pp;
    if (p >= end || *p != '"')
        return NULL;
    const char *start = ++p;
#if NAMES_SSE2
    if (end - start >= 16) { /* the usual: the name, its quote and its hash from one load */
        __m128i v;
        int refused = 0, k = short_name(start, &v, &refused);
        if (k >= 0) {
            if (refused)
                return NULL;
            *len = (size_t)k;
            *hash = hash_short(seed, v, (size_t)k);
            if (!(p = after_string(start + k, end)))
                return NULL;
            *pp = p;
            return start;
        }
    }
#endif
    p = plain_run_end(p, end);
    if (p >= end || *p != '"')
        return NULL;
    *len = (size_t)(p - start);
    *hash = hash_bytes(seed, start, *len);
    if (!(p = after_string(p, end)))
        return NULL;
    *pp = p;
    return start;
}

/* ids_json(data, limit): the ids of the names in `data`, the bytes of a JSON array of strings as
 * kube-scheduler writes NodeNames, packed; None when `data` is not such an array of plain ASCII strings (no
 * escapes) ending the buffer, holds more than `limit` names, or names one that is not held. Why: a filter of
 * all 5,000 nodes otherwise decodes 5,000 strings only to look them up here, and when the pod fits on every
 * node its answer echoes these very bytes (benchmarks/README.md, "The extender at a third of its CPU").
 * Batched as ids() (see there), parsing each batch first. */
static PyObject *index_ids_json(PyObject *self, PyObject *args) {
    enum { BATCH = 32 };
    NameIndex *ix = (NameIndex *)self;
    Py_buffer data;
    Py_ssize_t limit;
    if (ensure_init(ix) < 0 || !PyArg_ParseTuple(args, "y*n", &data, &limit))
        return NULL;
    const char *p = data.buf, *end = p + data.len;
    PyObject *out = NULL;
    /* room for every name it may hold: at most one per 3 bytes ("",) and at most `limit` */
    Py_ssize_t most = data.len / 3 + 1;
    if (limit < most)
        most = limit < 0 ? 0 : limit;
    p = skip_ws(p, end);
    if (p >= end || *p != '[')
        goto none;
    p = skip_ws(p + 1, end);
    if (most > PY_SSIZE_T_MAX / 4) {
        PyErr_NoMemory();
        goto done;
    }
    if ((out = PyBytes_FromStringAndSize(NULL, most * 4)) == NULL)
        goto done;
    uint32_t *ids = (uint32_t *)PyBytes_AS_STRING(out);
    Py_ssize_t count = 0;
    uint32_t hashes[BATCH];
    const char *bytes[BATCH];
    size_t lens[BATCH];
    while (p < end && *p != ']') {
        Py_ssize_t m = 0;
        while (m < BATCH && p < end && *p != ']') {
            if ((bytes[m] = next_name(&p, end, &lens[m], ix->seed, &hashes[m])) == NULL || count + m >= limit)
                goto none;
            __builtin_prefetch(&ix->slots[hashes[m] & ix->mask]);
            m++;
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            const Slot *s = &ix->slots[hashes[j] & ix->mask];
            if (s->hash == hashes[j])
                __builtin_prefetch(ix->arena + s->off);
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            const Slot *s = find_slot(ix, bytes[j], lens[j], hashes[j]);
            if (s->hash == 0)
                goto none;
            ids[count++] = s->id;
        }
    }
    if (p >= end || skip_ws(p + 1, end) != end)
        goto none;
    if (_PyBytes_Resize(&out, count * 4) < 0)
        out = NULL;
    goto done;
none:
    Py_CLEAR(out);
    out = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&data);
    return out;
}

/* Why a length method: tests compare the index with the dict it mirrors. */
static Py_ssize_t index_len(PyObject *self) {
    return (Py_ssize_t)((NameIndex *)self)->used;
}

/* Reads a packed-ids argument: its uint32 array and count (a length that is not a multiple of 4 is refused). */
static int read_ids(Py_buffer *buf, const uint32_t **ids, Py_ssize_t *count) {
    if (buf->len % 4 != 0) {
        PyErr_Format(PyExc_ValueError, "packed ids are 4 bytes each; got %zd bytes", buf->len);
        return -1;
    }
    *ids = (const uint32_t *)buf->buf;
    *count = buf->len / 4;
    return 0;
}

static PyObject *id_error(uint32_t id, Py_ssize_t size) {
    PyErr_Format(PyExc_IndexError, "node id %lu outside a table of %zd", (unsigned long)id, size);
    return NULL;
}

/* take(table, ids): bytes(table[i] for i in ids). Why: a filter reads every name's verdict kind (a byte per
 * node id) this way; Python's per-item getitem cost 70 us for 5,000 ids. */
static PyObject *nameids_take(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer table, packed;
    if (!PyArg_ParseTuple(args, "y*y*", &table, &packed))
        return NULL;
    const uint32_t *ids;
    Py_ssize_t count;
    PyObject *out = NULL;
    if (read_ids(&packed, &ids, &count) == 0 && (out = PyBytes_FromStringAndSize(NULL, count)) != NULL) {
        unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
        const unsigned char *t = table.buf;
        for (Py_ssize_t k = 0; k < count; k++) {
            if ((Py_ssize_t)ids[k] >= table.len) {
                Py_CLEAR(out);
                id_error(ids[k], table.len);
                break;
            }
            o[k] = t[ids[k]];
        }
    }
    PyBuffer_Release(&table);
    PyBuffer_Release(&packed);
    return out;
}

/* gather(items, ids): [items[i] for i in ids]. Why: the reasons of the nodes where a pod fails. */
static PyObject *nameids_gather(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *items;
    Py_buffer packed;
    if (!PyArg_ParseTuple(args, "O!y*", &PyList_Type, &items, &packed))
        return NULL;
    const uint32_t *ids;
    Py_ssize_t count;
    PyObject *out = NULL;
    if (read_ids(&packed, &ids, &count) == 0 && (out = PyList_New(count)) != NULL) {
        Py_ssize_t size = PyList_GET_SIZE(items);
        for (Py_ssize_t k = 0; k < count; k++) {
            if ((Py_ssize_t)ids[k] >= size) {
                Py_CLEAR(out);
                id_error(ids[k], size);
                break;
            }
            PyObject *item = PyList_GET_ITEM(items, ids[k]);
            Py_INCREF(item);
            PyList_SET_ITEM(out, k, item);
        }
    }
    PyBuffer_Release(&packed);
    return out;
}

/* select(ids, mask): the ids whose mask byte is not 0, packed (itertools.compress for packed ids). Why: the
 * ids of the nodes a pod fits, kept for the prioritize that follows. */
static PyObject *nameids_select(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer packed, mask;
    if (!PyArg_ParseTuple(args, "y*y*", &packed, &mask))
        return NULL;
    const uint32_t *ids;
    Py_ssize_t count;
    PyObject *out = NULL;
    if (read_ids(&packed, &ids, &count) == 0) {
        if (mask.len != count) {
            PyErr_Format(PyExc_ValueError, "a mask of %zd bytes for %zd ids", mask.len, count);
        } else {
            const unsigned char *m = mask.buf;
            Py_ssize_t kept = 0;
            for (Py_ssize_t k = 0; k < count; k++)
                kept += m[k] != 0;
            if ((out = PyBytes_FromStringAndSize(NULL, kept * 4)) != NULL) {
                uint32_t *o = (uint32_t *)PyBytes_AS_STRING(out);
                for (Py_ssize_t k = 0; k < count; k++)
                    if (m[k])
                        *o++ = ids[k];
            }
        }
    }
    PyBuffer_Release(&packed);
    PyBuffer_Release(&mask);
    return out;
}

/* join(texts, ids): b"[" + b",".join(texts[i] for i in ids) + b"]", or None when some texts[i] is not an
 * exact ASCII str (None: no text kept; the caller's Python path fills those in). Why: prioritize's answer is
 * the kept HostPriority JSON texts of the nodes, joined; gathering, joining and encoding them in Python
 * took three passes and 150 us for 5,000 nodes. */
static PyObject *nameids_join(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *texts;
    Py_buffer packed;
    if (!PyArg_ParseTuple(args, "O!y*", &PyList_Type, &texts, &packed))
        return NULL;
    const uint32_t *ids;
    Py_ssize_t count, size = PyList_GET_SIZE(texts);
    PyObject *out = NULL;
    if (read_ids(&packed, &ids, &count) < 0)
        goto done;
    Py_ssize_t total = 2 + (count > 0 ? count - 1 : 0);
    for (Py_ssize_t k = 0; k < count; k++) {
        if ((Py_ssize_t)ids[k] >= size) {
            id_error(ids[k], size);
            goto done;
        }
        /* the texts are scattered objects: ask for those a few ids ahead while this one is read */
        if (k + 8 < count && (Py_ssize_t)ids[k + 8] < size)
            __builtin_prefetch(PyList_GET_ITEM(texts, ids[k + 8]));
        size_t n = 0;
        if (ascii_name(PyList_GET_ITEM(texts, ids[k]), &n) == NULL) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        if ((size_t)total > (size_t)PY_SSIZE_T_MAX - n) {
            PyErr_NoMemory();
            goto done;
        }
        total += (Py_ssize_t)n;
    }
    if ((out = PyBytes_FromStringAndSize(NULL, total)) != NULL) {
        char *o = PyBytes_AS_STRING(out);
        *o++ = '[';
        for (Py_ssize_t k = 0; k < count; k++) {
            size_t n = 0;
            const char *p = ascii_name(PyList_GET_ITEM(texts, ids[k]), &n);
            if (k > 0)
                *o++ = ',';
            memcpy(o, p, n);
            o += n;
        }
        *o = ']';
    }
done:
    PyBuffer_Release(&packed);
    return out;
}

/* same(a, b): a == b for two lists (True or False), comparing exact strs here; None when a pair before the
 * first difference holds an item that is not an exact str (the caller compares those lists in Python). Why: prioritize checks that its names are the very names
 * its pod's filter passed (5,000 pairs of scattered strings); list == reads one pair after another, and
 * here the next pairs are fetched while one is compared. Two exact strs are equal when their lengths,
 * kinds and data are (PEP 393 keeps one canonical form per text). */
static PyObject *nameids_same(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &a, &PyList_Type, &b))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(a);
    if (PyList_GET_SIZE(b) != count)
        Py_RETURN_FALSE;
    for (Py_ssize_t k = 0; k < count; k++) {
        if (k + 8 < count) {
            __builtin_prefetch(PyList_GET_ITEM(a, k + 8));
            __builtin_prefetch(PyList_GET_ITEM(b, k + 8));
        }
        PyObject *x = PyList_GET_ITEM(a, k), *y = PyList_GET_ITEM(b, k);
        if (x == y)
            continue;
        if (!PyUnicode_CheckExact(x) || !PyUnicode_CheckExact(y))
            Py_RETURN_NONE;
        Py_ssize_t n = PyUnicode_GET_LENGTH(x);
        unsigned int kind = PyUnicode_KIND(x);
        if (n != PyUnicode_GET_LENGTH(y) || kind != PyUnicode_KIND(y) ||
            memcmp(PyUnicode_DATA(x), PyUnicode_DATA(y), (size_t)n * kind) != 0)
            Py_RETURN_FALSE; /* as list ==: the first pair that differs decides */
    }
    Py_RETURN_TRUE;
}

/* The decimal digits of `v` (0..255) at o; where they end. */
HOT char *put_score(char *o, unsigned v) {
    if (v >= 100)
        *o++ = (char)('0' + v / 100);
    if (v >= 10)
        *o++ = (char)('0' + v / 10 % 10);
    *o++ = (char)('0' + v % 10);
    return o;
}

/* hosts_json(data, ids, kinds, scores, fits): the HostPriorityList JSON of the names in `data` (a JSON array
 * of plain strings, as ids_json reads it) with the k-th name's score scores[ids[k]]:
 * [{"Host":"name","Score":n},...], each entry as wire.host_priority_json writes it; None when `data` is not
 * such an array, names another count than `ids`, or some kinds[ids[k]] is not `fits` (the caller's path
 * writes those). Why: prioritize's answer for 5,000 nodes was the nodes' kept texts joined (join above), 5,000
 * scattered str objects read per answer; here each name is checked and copied in one pass over the request's
 * own bytes, and the scores come from a byte per node. The caller vouches that ids[k] is the id of the k-th
 * name (they are ids_json's of the same bytes). */
static PyObject *nameids_hosts_json(PyObject *module, PyObject *args) {
    (void)module;
    static const char host[] = "{\"Host\":\"", score[] = "\",\"Score\":";
    Py_buffer data, packed, kinds, scores;
    int fits;
    if (!PyArg_ParseTuple(args, "y*y*y*y*i", &data, &packed, &kinds, &scores, &fits))
        return NULL;
    const uint32_t *ids;
    Py_ssize_t count, k = 0;
    PyObject *out = NULL;
    if (read_ids(&packed, &ids, &count) < 0)
        goto done;
    /* Sized exactly for an array written without whitespace (as kube-scheduler writes it): its bytes (the
     * names, their quotes, the commas and brackets), plus per entry the keys and braces (18) and its score's
     * digits; an array with whitespace takes less. An over-sized buffer shrunk at the end costs a copy. */
    Py_ssize_t size = data.len, within = kinds.len < scores.len ? kinds.len : scores.len;
    uint32_t top = 0; /* the largest id: every id within both tables when it is (one test, not 2 per id) */
    for (Py_ssize_t j = 0; j < count; j++)
        top = ids[j] > top ? ids[j] : top;
    if (count > 0 && (Py_ssize_t)top >= within) {
        Py_ssize_t j = 0;
        while ((Py_ssize_t)ids[j] < within) /* the first id outside, as the error names it */
            j++;
        id_error(ids[j], within);
        goto done;
    }
    if (count > (PY_SSIZE_T_MAX - size) / 21) { /* never with ids from a buffer (4 bytes each) */
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < count; j++) {
        unsigned v = ((const unsigned char *)scores.buf)[ids[j]];
        size += 18 + 1 + (v >= 10) + (v >= 100);
    }
    if ((out = PyBytes_FromStringAndSize(NULL, size)) == NULL)
        goto done;
    char *o = PyBytes_AS_STRING(out);
    const char *oend = o + size, *p = data.buf, *end = p + data.len;
    (void)oend;
    const unsigned char *kd = kinds.buf, *sc = scores.buf;
    p = skip_ws(p, end);
    if (p >= end || *p != '[')
        goto none;
    p = skip_ws(p + 1, end);
    *o++ = '[';
    while (p < end && *p != ']') {
        if (*p != '"' || k >= count)
            goto none;
        uint32_t id = ids[k]; /* within both tables (checked above: the largest is) */
        if (kd[id] != fits)
            goto none;
        if (k++ > 0)
            *o++ = ',';
        memcpy(o, host, sizeof host - 1);
        o += sizeof host - 1;
        const char *start = ++p; /* the name, checked as next_name checks it, copied */
#if NAMES_SSE2
        if (end - start >= 16 && oend - o >= 16) { /* the usual: checked and copied from one load (the bytes */
            __m128i v;                             /* stored past the name are written over by what follows) */
            int refused = 0, n = short_name(start, &v, &refused);
            if (n >= 0) {
                if (refused)
                    goto none;
                _mm_storeu_si128((__m128i *)(void *)o, v);
                o += n;
                p = start + n;
                goto named;
            }
        }
#endif
        p = plain_run_end(p, end);
        if (p >= end || *p != '"')
            goto none;
        o = copy_name(o, start, (size_t)(p - start));
#if NAMES_SSE2
    named:
#endif
        memcpy(o, score, sizeof score - 1);
        o = put_score(o + sizeof score - 1, sc[id]);
        *o++ = '}';
        if (!(p = after_string(p, end)))
            goto none;
    }
    if (k != count || p >= end || skip_ws(p + 1, end) != end)
        goto none;
    *o++ = ']';
    if (o - PyBytes_AS_STRING(out) != size && _PyBytes_Resize(&out, o - PyBytes_AS_STRING(out)) < 0)
        out = NULL;
    goto done;
none:
    Py_CLEAR(out);
    out = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&packed);
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&scores);
    return out;
}

/* ------------------------------------------------------------------ scores of pods spanning GPUs (issue 34)
 * span_scores is spanning.scores (the reference, in scheduler_extender/placement/spanning.py) for the memo's
 * refresh and fills of the spanning tables: a bind refreshes its node's verdict in every one of them (20 in
 * benchmarks/README.md's mix), ~10 k instructions a cell in Python. Codes beyond a score: */
#define SPAN_MAX_SCORE 10
#define SPAN_NO_ROOM 0xF0    /* fewer than N healthy GPUs have the share free */
#define SPAN_UNSEARCHED 0xF1 /* k's set search not made yet (the caller makes it and asks again) */
#define SPAN_GENERAL 0xF2    /* the general path (spanning.verdict) answers */
#define SPAN_MAX_GPUS 64     /* state.MAX_TOPOLOGY_GPUS: no set is searched beyond it */
#define SPAN_EXACT ((int64_t)1 << 52) /* ints below it in magnitude: exact as doubles, differences too */
#define SPAN_KIND_FAILS 2    /* fitmemo.FAILS */
#define SPAN_FAILED 0xFB     /* a failing cell written natively (fitmemo.FAILED; span_fill, span_refresh) */

/* Why: the reference's arithmetic is exact only while ints convert to doubles exactly; outside that (or for a
 * value that is not an int) 0 tells the caller to answer None, and the reference answers instead. An int of one
 * digit (below 2^30: every MiB figure of a view) is read in place where the build knows the layout: the spanning
 * fill and refresh read ~1,200 ints per pod (benchmarks/README.md, issue 34, seventh round). */
static int span_int(PyObject *o, int64_t *out) {
    if (!PyLong_CheckExact(o))
        return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        *out = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
        return 1;
    }
#elif PY_VERSION_HEX >= 0x030B0000 && PyLong_SHIFT == 30
    Py_ssize_t digits = Py_SIZE(o);
    if (digits >= -1 && digits <= 1) {
        *out = digits == 0 ? 0 : digits * (int64_t)((PyLongObject *)o)->ob_digit[0];
        return 1;
    }
#endif
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (v <= -SPAN_EXACT || v >= SPAN_EXACT)
        return 0;
    *out = (int64_t)v;
    return 1;
}

/* Why its own: Python's round() of a float (float.__round__ without digits) rounds half to even this way. */
static double span_round(double x) {
    double r = round(x);
    if (fabs(x - r) == 0.5)
        r = 2.0 * round(x / 2.0);
    return r;
}

/* Why bisect written out: the same probes as Python's bisect_left over `keys` (the view's free column), so
 * even an unsorted column (never made) answers as the reference. 1 with *k set; 0: a key is not an exact int. */
static int span_bisect(PyObject *keys, int64_t need, Py_ssize_t *k) {
    Py_ssize_t lo = 0, hi = PyTuple_GET_SIZE(keys);
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        int64_t v;
        if (!span_int(PyTuple_GET_ITEM(keys, mid), &v))
            return 0;
        if (v < need)
            lo = mid + 1;
        else
            hi = mid;
    }
    *k = lo;
    return 1;
}

/* Why a function: one chosen set's score for a need, as spanning.scores writes it (the same operations in the
 * same order: the same doubles). `at` is a checked tuple of 1 + 2 × gpus items. 1 with *code set; 0: not exact
 * (None to the caller); -1: a TypeError set (the memo's own data malformed). */
static int span_score(PyObject *at, int64_t need, long gpus, int spread, unsigned char *code) {
    PyObject *close = PyTuple_GET_ITEM(at, 0);
    if (!PyFloat_CheckExact(close)) {
        PyErr_SetString(PyExc_TypeError, "span_scores: a chosen set's closeness is not a float");
        return -1;
    }
    double left = 0.0;
    for (long g = 0; g < gpus; g++) {
        int64_t free_mib, mem;
        if (!span_int(PyTuple_GET_ITEM(at, 1 + 2 * g), &free_mib) || !span_int(PyTuple_GET_ITEM(at, 2 + 2 * g), &mem))
            return 0;
        if (mem <= 0) {
            *code = SPAN_GENERAL;
            return 1;
        }
        left += (double)(free_mib - need) / (double)mem;
    }
    left /= (double)gpus;
    double value = PyFloat_AS_DOUBLE(close) + 0.25 * (spread ? left : 1.0 - left);
    double scaled = (double)SPAN_MAX_SCORE * value;
    if (!isfinite(scaled)) {
        *code = SPAN_GENERAL;
        return 1;
    }
    double r = span_round(scaled);
    *code = (unsigned char)(r < 0.0 ? 0 : r > (double)SPAN_MAX_SCORE ? SPAN_MAX_SCORE : (int)r);
    return 1;
}

/* Why a function: the row at position p of `rows` as the search reads it (its index, MiB and free MiB, exact
 * ints), checked: 1 with the values set; 0 where the row is not a GpuRow of exact ints (the reference answers). */
static int span_row(PyObject *rows, Py_ssize_t p, int64_t *index, int64_t *mem, int64_t *free_mib) {
    PyObject *r = PyTuple_GET_ITEM(rows, p);
    if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) < 7)
        return 0;
    return span_int(PyTuple_GET_ITEM(r, 1), index) && span_int(PyTuple_GET_ITEM(r, 3), mem)
           && span_int(PyTuple_GET_ITEM(r, 6), free_mib);
}

/* Why: whether spanning._without_room's first branch holds for a NO_ROOM cell: at least N healthy GPUs of the node
 * are as large as `need`, so the pod fails now, not for ever. 1 it holds; 0 not, or a row or value not exact (the
 * caller's Python resolves the cell). */
static int span_large_enough(PyObject *rows, int64_t need, long gpus) {
    long large = 0;
    for (Py_ssize_t p = 0; p < PyTuple_GET_SIZE(rows); p++) {
        PyObject *r = PyTuple_GET_ITEM(rows, p);
        int64_t mem;
        if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) < 7 || !PyBool_Check(PyTuple_GET_ITEM(r, 4))
            || !span_int(PyTuple_GET_ITEM(r, 3), &mem))
            return 0;
        large += PyTuple_GET_ITEM(r, 4) == Py_True && mem >= need;
    }
    return large >= gpus;
}

/* Why: a NO_ROOM cell's reason natively (span_large_enough), its text the one kept for `need` in `texts`
 * (spanning.no_room_texts(N): need -> str). At 90 % full most spanning cells are such failures, and resolving each
 * in Python cost a scan of the rows and a write per cell at every fill and bind (benchmarks/README.md, issue 34,
 * seventh round). 1 with *text (borrowed: no Python code runs while it is used); 0 where Python resolves it (the
 * never path, a value not exact, a text not made yet); -1 an error set. */
static int span_no_room_text(PyObject *rows, int64_t need, long gpus, PyObject *texts, PyObject **text) {
    if (!span_large_enough(rows, need, gpus))
        return 0;
    PyObject *key = PyLong_FromLongLong((long long)need);
    if (key == NULL)
        return -1;
    PyObject *hit = PyDict_GetItemWithError(texts, key); /* an int key: hashed and compared without Python code */
    Py_DECREF(key);
    if (hit == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyUnicode_CheckExact(hit))
        return 0;
    *text = hit;
    return 1;
}

/* Why a function: a cell written failing now (fitmemo's FAILS, MIN_SCORE, the reason; no HostPriority text), as
 * FitMemo._put writes such a verdict. The old reason and text must be a str or None (releasing those runs no
 * Python code): 1 written; -1 a TypeError set. */
static int span_write_fails(unsigned char *kinds, unsigned char *scores, PyObject *reasons, PyObject *jsons,
                            Py_ssize_t i, PyObject *text) {
    PyObject *old = PyList_GET_ITEM(reasons, i), *json = PyList_GET_ITEM(jsons, i);
    if ((old != Py_None && !PyUnicode_CheckExact(old)) || (json != Py_None && !PyUnicode_CheckExact(json))) {
        PyErr_SetString(PyExc_TypeError, "span: a cell's reason or JSON is not a str or None");
        return -1;
    }
    kinds[i] = SPAN_KIND_FAILS;
    scores[i] = 0;
    if (old != text) {
        PyList_SET_ITEM(reasons, i, Py_NewRef(text));
        Py_DECREF(old);
    }
    if (json != Py_None) {
        PyList_SET_ITEM(jsons, i, Py_NewRef(Py_None));
        Py_DECREF(json);
    }
    return 1;
}

/* Why its own: the bit mask of the positions with room (the free order from k on), as spanning._search builds it;
 * 0 where an index is not a position of the node (the reference answers). */
static int span_mask(PyObject *rows, PyObject *free_rows, Py_ssize_t k, uint64_t *mask) {
    Py_ssize_t n = PyTuple_GET_SIZE(rows);
    *mask = 0;
    for (Py_ssize_t j = k; j < PyTuple_GET_SIZE(free_rows); j++) {
        PyObject *r = PyTuple_GET_ITEM(free_rows, j);
        int64_t index;
        if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) < 7 || !span_int(PyTuple_GET_ITEM(r, 1), &index)
            || index < 0 || index >= n)
            return 0;
        *mask |= (uint64_t)1 << index;
    }
    return 1;
}

/* Why a function: the policy's pick among the closest fitting sets (more than one), as spanning._search writes
 * it: each set's free fractions (`fraction`, by position, n of them) added left to right from 0.0
 * (spanning._added: not Python's sum, compensated from 3.12 on), negated for spread; the least wins, ties to the
 * lower positions. One loop for span_pick and span_cache_search (`who` names the caller in an error). *best: the
 * set. 1; 0 where a position is not exact; -1 a TypeError set. */
static int span_pick_of(const double *fraction, Py_ssize_t n, PyObject *fitting, long gpus, int spread,
                        const char *who, PyObject **best) {
    double best_value = 0.0;
    int64_t best_pos[SPAN_MAX_GPUS];
    *best = NULL;
    for (Py_ssize_t s = 0; s < PyTuple_GET_SIZE(fitting); s++) {
        PyObject *pos = PyTuple_GET_ITEM(fitting, s);
        if (!PyTuple_CheckExact(pos) || PyTuple_GET_SIZE(pos) != gpus) {
            PyErr_Format(PyExc_TypeError, "%s: a fitting set is not a tuple of %ld positions", who, gpus);
            return -1;
        }
        int64_t at[SPAN_MAX_GPUS];
        double value = 0.0;
        for (long g = 0; g < gpus; g++) {
            if (!span_int(PyTuple_GET_ITEM(pos, g), &at[g]) || at[g] < 0 || at[g] >= n)
                return 0;
            value += fraction[at[g]];
        }
        if (spread)
            value = -value;
        int lower = 0; /* pos < best's positions, as Python compares tuples of ints */
        if (*best != NULL && value == best_value) {
            long g = 0;
            while (g < gpus && at[g] == best_pos[g])
                g++;
            lower = g < gpus && at[g] < best_pos[g];
        }
        if (*best == NULL || value < best_value || lower) {
            *best = pos;
            best_value = value;
            memcpy(best_pos, at, sizeof(at[0]) * (size_t)gpus);
        }
    }
    return 1;
}

/* Why a function: span_pick_of on the rows' free fractions. *best: the set. 1; 0 where a row or position is not
 * exact or a GPU has 0 MiB (the reference answers: it divides for every row); -1 error. */
static int span_pick(PyObject *rows, PyObject *fitting, long gpus, int spread, PyObject **best) {
    Py_ssize_t n = PyTuple_GET_SIZE(rows);
    double fraction[SPAN_MAX_GPUS];
    for (Py_ssize_t p = 0; p < n; p++) {
        int64_t index, mem, free_mib;
        if (!span_row(rows, p, &index, &mem, &free_mib) || mem == 0)
            return 0;
        fraction[p] = (double)free_mib / (double)mem;
    }
    return span_pick_of(fraction, n, fitting, gpus, spread, "span_scores", best);
}

/* Why a function: a kept mask's entry (distance, sets), as spanning._closest keeps it, read once for span_search
 * and span_cache_search (`who` names the caller in an error): *d its distance, *positions the set the policy
 * picks: the only one, else span_pick_of on `fraction` (NULL: span_pick on `rows`). 1; 0 where the reference
 * answers (no sets, a distance without an exact closeness, a row or position not exact); -1 a TypeError set. */
static int span_hit_positions(PyObject *hit, PyObject *closes, PyObject *rows, const double *fraction, long gpus,
                              int spread, const char *who, int64_t *d, PyObject **positions) {
    if (!PyTuple_CheckExact(hit) || PyTuple_GET_SIZE(hit) != 2 || !PyTuple_CheckExact(PyTuple_GET_ITEM(hit, 1))
        || !span_int(PyTuple_GET_ITEM(hit, 0), d)) {
        PyErr_Format(PyExc_TypeError, "%s: a kept mask's sets are not (distance, sets)", who);
        return -1;
    }
    PyObject *fitting = PyTuple_GET_ITEM(hit, 1);
    if (*d < 0 || *d >= PyTuple_GET_SIZE(closes) || PyTuple_GET_SIZE(fitting) == 0
        || !PyFloat_CheckExact(PyTuple_GET_ITEM(closes, *d)))
        return 0;
    if (PyTuple_GET_SIZE(fitting) == 1) {
        *positions = PyTuple_GET_ITEM(fitting, 0);
        return 1;
    }
    if (fraction == NULL)
        return span_pick(rows, fitting, gpus, spread, positions);
    return span_pick_of(fraction, PyTuple_GET_SIZE(rows), fitting, gpus, spread, who, positions);
}


/* span_search: spanning._search's mask path natively, for the set search of k that `chosen` lacks. `search` is
 * (rows, free_rows, by_mask, closes): the view's GPUs (their index = their position: the caller checked the
 * ends), its healthy GPUs by (free, index), the closest fitting sets kept per mask for this topology and N
 * (spanning._closest's dict, read only: a mask not yet there is the reference's to scan and keep) and the score's
 * closeness part per distance. *out: a new reference to the chosen set, flat as spanning.Found keeps it. 1; 0
 * where the reference answers instead (a mask not kept yet, a value not exact); -1 an error set. */
static int span_search(PyObject *search, Py_ssize_t k, long gpus, int spread, PyObject **out) {
    PyObject *rows = PyTuple_GET_ITEM(search, 0), *free_rows = PyTuple_GET_ITEM(search, 1);
    PyObject *by_mask = PyTuple_GET_ITEM(search, 2), *closes = PyTuple_GET_ITEM(search, 3);
    uint64_t mask;
    if (PyTuple_GET_SIZE(rows) > SPAN_MAX_GPUS || !span_mask(rows, free_rows, k, &mask))
        return 0;
    PyObject *key = PyLong_FromUnsignedLongLong(mask);
    if (key == NULL)
        return -1;
    PyObject *hit = PyDict_GetItemWithError(by_mask, key); /* borrowed; ints hash and compare without Python code */
    Py_DECREF(key);
    if (hit == NULL)
        return PyErr_Occurred() ? -1 : 0;
    int64_t d;
    PyObject *positions = NULL;
    int usable = span_hit_positions(hit, closes, rows, NULL, gpus, spread, "span_scores", &d, &positions);
    if (usable != 1)
        return usable;
    if (!PyTuple_CheckExact(positions) || PyTuple_GET_SIZE(positions) != gpus) {
        PyErr_Format(PyExc_TypeError, "span_scores: a fitting set is not a tuple of %ld positions", gpus);
        return -1;
    }
    PyObject *chosen = PyTuple_New(1 + 2 * gpus);
    if (chosen == NULL)
        return -1;
    PyObject *close = PyTuple_GET_ITEM(closes, d);
    Py_INCREF(close);
    PyTuple_SET_ITEM(chosen, 0, close);
    for (long g = 0; g < gpus; g++) {
        int64_t p, index, mem, free_mib;
        if (!span_int(PyTuple_GET_ITEM(positions, g), &p) || p < 0 || p >= PyTuple_GET_SIZE(rows)
            || !span_row(rows, p, &index, &mem, &free_mib)) {
            Py_DECREF(chosen);
            return 0;
        }
        PyObject *r = PyTuple_GET_ITEM(rows, p), *f = PyTuple_GET_ITEM(r, 6), *m = PyTuple_GET_ITEM(r, 3);
        Py_INCREF(f);
        Py_INCREF(m);
        PyTuple_SET_ITEM(chosen, 1 + 2 * g, f);
        PyTuple_SET_ITEM(chosen, 2 + 2 * g, m);
    }
    *out = chosen;
    return 1;
}

/* Why a function: one need's code (the body of spanning.scores' loop), the set search of its k made first where
 * `search` is given (span_search) and `chosen` lacks it; returns as span_score. */
static int span_code(PyObject *keys, PyObject *chosen, int64_t need, long gpus, int spread, PyObject *search,
                     unsigned char *code) {
    Py_ssize_t k;
    if (!span_bisect(keys, need, &k))
        return 0;
    if (PyTuple_GET_SIZE(keys) - k < gpus) {
        *code = SPAN_NO_ROOM;
        return 1;
    }
    if (k >= PyList_GET_SIZE(chosen)) {
        PyErr_Format(PyExc_IndexError, "span_scores: k %zd outside the chosen sets (%zd)", k,
                     PyList_GET_SIZE(chosen));
        return -1;
    }
    PyObject *at = PyList_GET_ITEM(chosen, k);
    if (at == Py_None && search != NULL) { /* searched here and kept in `chosen`, as the caller would */
        PyObject *found = NULL;
        int ok = span_search(search, k, gpus, spread, &found);
        if (ok < 0)
            return -1;
        if (ok == 1) {
            if (PyList_SetItem(chosen, k, found) < 0) /* steals `found`; releases the None */
                return -1;
            at = found;
        }
    }
    if (at == Py_None) {
        *code = SPAN_UNSEARCHED;
        return 1;
    }
    if (at == Py_False) {
        *code = SPAN_GENERAL;
        return 1;
    }
    if (!PyTuple_CheckExact(at) || PyTuple_GET_SIZE(at) != 1 + 2 * gpus) {
        PyErr_Format(PyExc_TypeError, "span_scores: chosen set %zd is not None, False or a tuple of %ld items", k,
                     1 + 2 * gpus);
        return -1;
    }
    return span_score(at, need, gpus, spread, code);
}

/* What a span_scores call answers for its codes `out` and how their loop ended (span_code's `ok`): the codes
 * (1), None where one could not be exact (0), or the error raised (-1); `out` is released unless answered. */
static PyObject *span_result(PyObject *out, int ok) {
    if (ok == 1)
        return out;
    Py_DECREF(out);
    if (ok < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* span_scores(keys, chosen, needs, gpus, spread, search=None): spanning.scores natively; None where it cannot be
 * exact (an int beyond 2^52 in magnitude, or not an int: the reference answers). With `search` (span_search's),
 * the set searches `chosen` lacks are made here and kept in it where they can be (spanning.codes). Every loop is
 * bounded by a length read here (needs, keys, gpus ≤ SPAN_MAX_GPUS, each tuple's checked length, the rows ≤
 * SPAN_MAX_GPUS), and no Python code runs. */
static PyObject *nameids_span_scores(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *keys, *chosen, *needs, *search = Py_None;
    long gpus;
    int spread;
    if (!PyArg_ParseTuple(args, "O!O!Olp|O", &PyTuple_Type, &keys, &PyList_Type, &chosen, &needs, &gpus, &spread,
                          &search))
        return NULL;
    if (gpus < 1 || gpus > SPAN_MAX_GPUS) {
        PyErr_Format(PyExc_ValueError, "span_scores: gpus %ld outside 1..%d", gpus, SPAN_MAX_GPUS);
        return NULL;
    }
    if (search == Py_None)
        search = NULL;
    else if (!PyTuple_CheckExact(search) || PyTuple_GET_SIZE(search) != 4
             || !PyTuple_CheckExact(PyTuple_GET_ITEM(search, 0)) || !PyTuple_CheckExact(PyTuple_GET_ITEM(search, 1))
             || !PyDict_CheckExact(PyTuple_GET_ITEM(search, 2)) || !PyTuple_CheckExact(PyTuple_GET_ITEM(search, 3))) {
        PyErr_SetString(PyExc_TypeError, "span_scores: search must be None or (rows, free_rows, by_mask, closes): "
                        "tuple, tuple, dict, tuple");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(needs, "span_scores: needs must be a list or a tuple");
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyBytes_FromStringAndSize(NULL, count);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int ok = 1;
    for (Py_ssize_t j = 0; j < count && ok == 1; j++) {
        int64_t need;
        ok = span_int(items[j], &need) ? span_code(keys, chosen, need, gpus, spread, search, &o[j]) : 0;
    }
    Py_DECREF(seq);
    return span_result(out, ok);
}

/* span_scores_each(keys_of, chosen_of, need, gpus, spread): span_scores(keys_of[j], chosen_of[j], (need,), gpus,
 * spread)[0] for every node j, in one call (the memo's fill of a spanning table meets hundreds of nodes without a
 * verdict); None where one of them cannot be exact. Bounded by the two lists' common length. */
static PyObject *nameids_span_scores_each(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *keys_of, *chosen_of, *need_obj;
    long gpus;
    int spread;
    if (!PyArg_ParseTuple(args, "O!O!Olp", &PyList_Type, &keys_of, &PyList_Type, &chosen_of, &need_obj, &gpus,
                          &spread))
        return NULL;
    if (gpus < 1 || gpus > SPAN_MAX_GPUS) {
        PyErr_Format(PyExc_ValueError, "span_scores_each: gpus %ld outside 1..%d", gpus, SPAN_MAX_GPUS);
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(keys_of);
    if (PyList_GET_SIZE(chosen_of) != count) {
        PyErr_Format(PyExc_ValueError, "span_scores_each: %zd keys for %zd chosen lists", count,
                     PyList_GET_SIZE(chosen_of));
        return NULL;
    }
    int64_t need;
    if (!span_int(need_obj, &need))
        Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, count);
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    int ok = 1;
    for (Py_ssize_t j = 0; j < count && ok == 1; j++) {
        PyObject *keys = PyList_GET_ITEM(keys_of, j), *chosen = PyList_GET_ITEM(chosen_of, j);
        if (!PyTuple_CheckExact(keys) || !PyList_CheckExact(chosen)) {
            PyErr_Format(PyExc_TypeError, "span_scores_each: node %zd's keys are not a tuple or its chosen sets "
                         "not a list", j);
            ok = -1;
            break;
        }
        ok = span_code(keys, chosen, need, gpus, spread, NULL, &o[j]);
    }
    return span_result(out, ok);
}

/* name_hash(seed, name): the hash an exact ASCII str is held under in a NameIndex(seed), None for another
 * object. Why: tests need names that share a hash (each lookup compares the bytes of a name whose hash matches,
 * and only two such names tell a compare that answers "same" wrongly); 2^32 hashes take a brute-force search. */
static PyObject *nameids_name_hash(PyObject *module, PyObject *args) {
    (void)module;
    unsigned long long seed;
    PyObject *name;
    if (!PyArg_ParseTuple(args, "KO", &seed, &name))
        return NULL;
    size_t n = 0;
    const char *p = ascii_name(name, &n);
    if (p == NULL)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(hash_bytes(seed, p, n));
}

/* ------------------------------------------------------------------ a spanning table's fill in one call (issue 34)
 * span_fill is FitMemo._fill_spanning's loop over the cells a request finds empty: per node its view (from the
 * state's views by name), the set searches kept for it (the memo's _found), its code (span_code, the search made
 * here where span_search can), and, where the pod fits and the node's HostPriority text for that score is kept, the
 * cell written here. Every other cell is answered with its code for the caller's Python (the reference:
 * spanning.codes and resolve). Codes beyond span_code's: */
#include <structmember.h> /* T_OBJECT_EX: how a slot of the memo's NodeView is held */
#define SPAN_WRITTEN 0xF8 /* the cell written here */
#define SPAN_SKIPPED 0xF9 /* the cell held a verdict already (a repeated id), or the node has no view */
#define SPAN_CAPPED 0xFA  /* the limit cap may change the verdict on this node: the caller judges it alone */
#define SPAN_FITS 1       /* fitmemo.FITS */
enum { F_UNIT, F_UNPLACED, F_ERROR, F_ROWS, F_KEYS, F_FREE_ROWS, F_TOPO, F_OVER, F_FIELDS };
static const char *const fill_fields[F_FIELDS] = {"unit_mib", "unplaced_mib", "error", "rows", "free_keys",
                                                  "free_rows", "topo", "over"};

/* What a span_fill call reads of every node: the view type's slots, the table's arrays and the pod's key. */
typedef struct {
    PyTypeObject *view_type;
    Py_ssize_t offset[F_FIELDS]; /* where each field's slot lies in a view (the type's member descriptors) */
    PyObject *names, *views, *founds, *at, *levels, *jsons, *host_json, *gpus_obj, *reasons;
    PyObject *no_room;    /* spanning.no_room_texts(N) (need -> str), or NULL: every NO_ROOM cell left to Python */
    PyObject *last_text;  /* the text of last_need (a strong reference: held while the call writes it) */
    int64_t last_need;
    Py_hash_t at_hash;
    unsigned char *kinds, *scores;
    Py_ssize_t table_len, found_max;
    int64_t units;
    long gpus;
    int spread, check_over;
    PyObject *last_topo, *plan; /* the last topology met and its entry in levels (strong references; plan NULL: none) */
} SpanFill;

/* Why: the view's fields are read where the type keeps them (a slot of a frozen dataclass: a member descriptor
 * holding an object), with no attribute lookup per read: PyObject_GetAttr cost ~100 instructions a field, five
 * fields a cell. 0 with every offset set; -1 (TypeError) when a field is not such a slot of view_type. */
static int fill_offsets(SpanFill *f) {
    for (int j = 0; j < F_FIELDS; j++) {
        PyObject *name = PyUnicode_InternFromString(fill_fields[j]);
        if (name == NULL)
            return -1;
        PyObject *descr = _PyType_Lookup(f->view_type, name); /* borrowed; no Python code runs */
        Py_DECREF(name);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)
            || ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "span_fill: %s.%s is not a slot holding an object", f->view_type->tp_name,
                         fill_fields[j]);
            return -1;
        }
        f->offset[j] = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    return 0;
}

/* Why: one field of a view (of view_type exactly, checked by the caller), as a new reference; NULL with an
 * AttributeError where the slot is empty (a view made without it). */
static PyObject *fill_field(const SpanFill *f, PyObject *view, int field) {
    PyObject *v = *(PyObject **)(void *)((char *)view + f->offset[field]);
    if (v == NULL) {
        PyErr_Format(PyExc_AttributeError, "span_fill: a view without %s", fill_fields[field]);
        return NULL;
    }
    return Py_NewRef(v);
}

/* Why a function: the found dict of node `id` (the set searches kept for its view), made when it has none, with
 * fitmemo's bound (FOUND_MAX: all dropped when full); then the chosen list of the pod's (N, policy), made with
 * len(keys) + 1 entries when absent. A new reference to the list in *chosen; -1 with an error set. */
static int fill_chosen(SpanFill *f, PyObject *id, Py_ssize_t nkeys, PyObject **chosen) {
    PyObject *found = PyDict_GetItemWithError(f->founds, id);
    if (found == NULL) {
        if (PyErr_Occurred())
            return -1;
        if (PyDict_GET_SIZE(f->founds) >= f->found_max)
            PyDict_Clear(f->founds);
        found = PyDict_New();
        if (found == NULL)
            return -1;
        int bad = PyDict_SetItem(f->founds, id, found);
        Py_DECREF(found); /* the dict holds it */
        if (bad < 0)
            return -1;
    } else if (!PyDict_CheckExact(found)) {
        PyErr_SetString(PyExc_TypeError, "span_fill: a node's kept set searches are not a dict");
        return -1;
    }
    PyObject *list = _PyDict_GetItem_KnownHash(found, f->at, f->at_hash); /* the key's hash made once a call */
    if (list == NULL) {
        if (PyErr_Occurred())
            return -1;
        list = PyList_New(nkeys + 1);
        if (list == NULL)
            return -1;
        for (Py_ssize_t j = 0; j <= nkeys; j++)
            PyList_SET_ITEM(list, j, Py_NewRef(Py_None));
        if (_PyDict_SetItem_KnownHash(found, f->at, list, f->at_hash) < 0) {
            Py_DECREF(list);
            return -1;
        }
    } else if (!PyList_CheckExact(list)) {
        PyErr_SetString(PyExc_TypeError, "span_fill: a node's chosen sets are not a list");
        return -1;
    } else
        Py_INCREF(list);
    *chosen = list;
    return 0;
}

/* Why: the kept masks and closeness table of this topology and N (spanning._plan's entry in `levels`, keyed by
 * (id(topo), N) and holding topo itself), as spanning._native_search reads them; 1 with f->plan set, 0 where none
 * is kept (the caller's Python makes it), -1 error. The last topology's is kept for the call: a cluster has a few
 * board types, one topology object each. */
static int fill_plan(SpanFill *f, PyObject *topo) {
    if (topo == f->last_topo)
        return f->plan != NULL;
    Py_XSETREF(f->last_topo, Py_NewRef(topo));
    Py_CLEAR(f->plan);
    PyObject *id = PyLong_FromVoidPtr(topo), *key = id ? PyTuple_Pack(2, id, f->gpus_obj) : NULL;
    Py_XDECREF(id);
    if (key == NULL)
        return -1;
    PyObject *hit = PyDict_GetItemWithError(f->levels, key); /* a tuple of ints: hashed without Python code */
    Py_DECREF(key);
    if (hit == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_CheckExact(hit) || PyTuple_GET_SIZE(hit) != 4 || PyTuple_GET_ITEM(hit, 0) != topo
        || PyTuple_GET_ITEM(hit, 1) == Py_None || !PyDict_CheckExact(PyTuple_GET_ITEM(hit, 2))
        || !PyTuple_CheckExact(PyTuple_GET_ITEM(hit, 3)))
        return 0;
    f->plan = Py_NewRef(hit);
    return 1;
}

/* Why: a mask of GPUs with room that the plan has not met yet (span_search leaves it UNSEARCHED) looked for in the
 * plan's levels and kept in its by_mask, as spanning._closest does (span_closest, the refresh's), so the search is
 * made here: at 90 % full many masks are met first by a fill, and the reference's search of each cost more than
 * the rest of that fill's cells (benchmarks/README.md, issue 34, seventh round). 1 kept; 0 not (levels not as
 * _plan makes them, no set fits, a row not exact: the caller's Python searches); -1 an error set. */
static int fill_levels(PyObject *plan, PyObject *rows, PyObject *free_rows, PyObject *keys, int64_t need) {
    PyObject *levels = PyTuple_GET_ITEM(plan, 1), *by_mask = PyTuple_GET_ITEM(plan, 2);
    Py_ssize_t k;
    uint64_t mask;
    if (!PyTuple_CheckExact(levels) || PyTuple_GET_SIZE(rows) > SPAN_MAX_GPUS || !span_bisect(keys, need, &k)
        || !span_mask(rows, free_rows, k, &mask))
        return 0;
    PyObject *key = PyLong_FromUnsignedLongLong(mask);
    if (key == NULL)
        return -1;
    PyObject *hit = PyDict_GetItemWithError(by_mask, key);
    if (hit != NULL || PyErr_Occurred()) { /* kept already: the search failed for another reason (left) */
        Py_DECREF(key);
        return hit != NULL ? 0 : -1;
    }
    hit = span_closest(levels, by_mask, key, mask); /* borrowed from by_mask */
    Py_DECREF(key);
    return hit != NULL ? 1 : PyErr_Occurred() ? -1 : 0;
}

/* Why a function: the set search span_code lacked (UNSEARCHED) made here where spanning._native_search would give
 * one: a topology matrix (not an int), GPU indices 0..G-1 in rows order, the plan kept. Returns as span_code; the
 * code stays UNSEARCHED where no search can be made here (the caller's Python makes it). */
static int fill_search(SpanFill *f, PyObject *view, PyObject *rows, PyObject *keys, PyObject *chosen, int64_t need,
                       unsigned char *code) {
    Py_ssize_t n = PyTuple_GET_SIZE(rows);
    int64_t first, last, mem, free_mib;
    if (!span_row(rows, 0, &first, &mem, &free_mib) || !span_row(rows, n - 1, &last, &mem, &free_mib) || first != 0
        || last != n - 1)
        return 1;
    PyObject *topo = fill_field(f, view, F_TOPO);
    if (topo == NULL)
        return -1;
    int ok = PyTuple_CheckExact(topo) ? fill_plan(f, topo) : 0;
    Py_DECREF(topo);
    if (ok != 1)
        return ok < 0 ? -1 : 1;
    PyObject *free_rows = fill_field(f, view, F_FREE_ROWS), *plan = f->plan, *search = NULL;
    if (free_rows == NULL)
        return -1;
    if (PyTuple_CheckExact(free_rows))
        search = PyTuple_Pack(4, rows, free_rows, PyTuple_GET_ITEM(plan, 2), PyTuple_GET_ITEM(plan, 3));
    Py_DECREF(free_rows);
    if (search == NULL)
        return PyErr_Occurred() ? -1 : 1;
    ok = span_code(keys, chosen, need, f->gpus, f->spread, search, code);
    if (ok == 1 && *code == SPAN_UNSEARCHED) {
        int kept = fill_levels(plan, rows, PyTuple_GET_ITEM(search, 1), keys, need);
        ok = kept == 1 ? span_code(keys, chosen, need, f->gpus, f->spread, search, code) : kept < 0 ? -1 : 1;
    }
    Py_DECREF(search);
    return ok;
}

/* Why a function: the code of a view with rows, keys and need read (fill_code): the chosen list of its (N, policy),
 * span_code, the search where it lacked one; GENERAL where a value is not exact here (the reference answers). */
static int fill_chosen_code(SpanFill *f, PyObject *view, PyObject *id, PyObject *rows, PyObject *keys, int64_t need,
                            unsigned char *code) {
    PyObject *chosen;
    if (fill_chosen(f, id, PyTuple_GET_SIZE(keys), &chosen) < 0)
        return -1;
    int got = span_code(keys, chosen, need, f->gpus, f->spread, NULL, code);
    if (got == 1 && *code == SPAN_UNSEARCHED)
        got = fill_search(f, view, rows, keys, chosen, need, code);
    Py_DECREF(chosen);
    if (got == 0)
        *code = SPAN_GENERAL;
    return got < 0 ? -1 : 0;
}

/* Why a function: a NO_ROOM cell's reason (span_no_room_text), the last need's kept for the call (one size: every
 * node of one unit asks the same). 1 with *text; 0 left to Python; -1 an error set. */
static int fill_no_room(SpanFill *f, PyObject *rows, int64_t need, PyObject **text) {
    if (f->no_room == NULL)
        return 0;
    if (f->last_text != NULL && f->last_need == need) {
        if (!span_large_enough(rows, need, f->gpus))
            return 0;
        *text = f->last_text;
        return 1;
    }
    int ok = span_no_room_text(rows, need, f->gpus, f->no_room, text);
    if (ok == 1) {
        f->last_need = need;
        Py_XSETREF(f->last_text, Py_NewRef(*text));
    }
    return ok;
}

/* Why a function: one node's code for the pod (span_code's, or SPAN_CAPPED), read off its view as spanning.codes
 * reads it; GENERAL wherever a value is not what the memo's views hold (the general path answers any view). A
 * NO_ROOM code whose reason is written natively comes with *text set (fill_no_room; else *text stays NULL). */
static int fill_code(SpanFill *f, PyObject *view, PyObject *id, unsigned char *code, PyObject **text) {
    *code = SPAN_GENERAL;
    PyObject *v[F_TOPO] = {NULL};
    int ok = 0;
    for (int j = 0; j < F_TOPO && ok == 0; j++)
        ok = (v[j] = fill_field(f, view, j)) != NULL ? 0 : -1;
    if (ok == 0 && f->check_over) {
        PyObject *over = *(PyObject **)(void *)((char *)view + f->offset[F_OVER]);
        if (over != Py_None) /* (an empty slot too: the reference reads it) */
            *code = SPAN_CAPPED;
    }
    int64_t unit, unplaced;
    PyObject *error = ok == 0 ? v[F_ERROR] : NULL, *rows = v[F_ROWS], *keys = v[F_KEYS];
    if (ok == 0 && *code == SPAN_GENERAL && span_int(v[F_UNPLACED], &unplaced) && unplaced == 0
        && (error == Py_None || (PyUnicode_CheckExact(error) && PyUnicode_GET_LENGTH(error) == 0))
        && PyTuple_CheckExact(rows) && PyTuple_GET_SIZE(rows) > 0 && PyTuple_CheckExact(keys)
        && span_int(v[F_UNIT], &unit) && unit > 0 && f->units < SPAN_EXACT / unit)
        ok = fill_chosen_code(f, view, id, rows, keys, f->units * unit, code); /* key[0] × unit_mib, exact */
    if (ok == 0 && *code == SPAN_NO_ROOM && fill_no_room(f, rows, f->units * unit, text) < 0)
        ok = -1;
    for (int j = 0; j < F_TOPO; j++)
        Py_XDECREF(v[j]);
    return ok;
}

/* Why a function: a fitting cell written (kind, score, the node's kept HostPriority text for that score) where
 * that text is kept (fitmemo's _host_json: per id None or a tuple of texts by score); 0 when it is not (the
 * caller makes it, as for an id beyond host_json), 1 written. */
static int fill_write(SpanFill *f, Py_ssize_t i, unsigned char code) {
    if (i >= PyList_GET_SIZE(f->host_json))
        return 0;
    PyObject *texts = PyList_GET_ITEM(f->host_json, i);
    if (!PyTuple_CheckExact(texts) || PyTuple_GET_SIZE(texts) <= code)
        return 0;
    PyObject *text = PyTuple_GET_ITEM(texts, code);
    if (!PyUnicode_CheckExact(text))
        return 0;
    f->kinds[i] = SPAN_FITS;
    f->scores[i] = code;
    PyObject *old = PyList_GET_ITEM(f->jsons, i);
    PyList_SET_ITEM(f->jsons, i, Py_NewRef(text));
    Py_DECREF(old); /* (None in an empty cell) */
    return 1;
}

/* Why its own: the argument checks of span_fill; 0, or -1 with the error naming the bad argument. */
static int fill_check(SpanFill *f, Py_buffer *kinds, Py_buffer *scores) {
    if (f->gpus < 1 || f->gpus > SPAN_MAX_GPUS) {
        PyErr_Format(PyExc_ValueError, "span_fill: gpus %ld outside 1..%d", f->gpus, SPAN_MAX_GPUS);
        return -1;
    }
    f->table_len = kinds->len;
    if (scores->len != f->table_len || PyList_GET_SIZE(f->jsons) != f->table_len
        || PyList_GET_SIZE(f->reasons) != f->table_len) {
        PyErr_Format(PyExc_ValueError, "span_fill: a table of %zd kinds, %zd scores, %zd texts and %zd reasons",
                     kinds->len, scores->len, PyList_GET_SIZE(f->jsons), PyList_GET_SIZE(f->reasons));
        return -1;
    }
    if (f->no_room == Py_None)
        f->no_room = NULL;
    else if (!PyDict_CheckExact(f->no_room)) {
        PyErr_SetString(PyExc_TypeError, "span_fill: no_room must be a dict (need -> text) or None");
        return -1;
    }
    if (f->units < 0 || f->found_max < 1) {
        PyErr_SetString(PyExc_ValueError, "span_fill: units below 0 or found_max below 1");
        return -1;
    }
    if ((f->at_hash = PyObject_Hash(f->at)) == -1) /* a tuple: its items' hashes (an unhashable one raises) */
        return -1;
    return fill_offsets(f);
}

/* Why: the view of node id i (its name in the memo's names, looked up in the state's views by name), borrowed;
 * NULL without an error where it has none (a free id, a node gone), NULL with one where an entry is not a view. */
static PyObject *fill_view(const SpanFill *f, Py_ssize_t i) {
    if (i >= PyList_GET_SIZE(f->names))
        return NULL;
    PyObject *name = PyList_GET_ITEM(f->names, i);
    if (!PyUnicode_CheckExact(name)) /* None: a free id */
        return NULL;
    PyObject *view = PyDict_GetItemWithError(f->views, name); /* a str key: compared without Python code */
    if (view != NULL && Py_TYPE(view) != f->view_type) {
        PyErr_Format(PyExc_TypeError, "span_fill: the view of node id %zd is not a %s", i, f->view_type->tp_name);
        return NULL;
    }
    return view;
}

/* Why its own: the loop of span_fill over its ids, once the arguments are checked; 0 or -1 (an error set). */
static int fill_loop(SpanFill *f, PyObject *ids, unsigned char *o, Py_ssize_t *filled) {
    for (Py_ssize_t p = 0; p < PyList_GET_SIZE(ids); p++) {
        PyObject *id = PyList_GET_ITEM(ids, p);
        Py_ssize_t i = PyLong_CheckExact(id) ? PyLong_AsSsize_t(id) : -1;
        if (i < 0 || i >= f->table_len) {
            if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();
            PyErr_Format(PyExc_IndexError, "span_fill: the id at position %zd is not one of a table of %zd", p,
                         f->table_len);
            return -1;
        }
        PyObject *view = f->kinds[i] == 0 ? fill_view(f, i) : NULL;
        if (view == NULL) {
            if (PyErr_Occurred())
                return -1;
            o[p] = SPAN_SKIPPED;
            continue;
        }
        Py_INCREF(view); /* held while its fields are read (allocations below may collect garbage) */
        PyObject *text = NULL;
        int ok = fill_code(f, view, id, &o[p], &text);
        Py_DECREF(view);
        if (ok < 0)
            return -1;
        if (o[p] <= SPAN_MAX_SCORE && fill_write(f, i, o[p])) {
            o[p] = SPAN_WRITTEN;
            *filled += 1;
        } else if (text != NULL) { /* NO_ROOM, failing now: its reason written */
            if (span_write_fails(f->kinds, f->scores, f->reasons, f->jsons, i, text) < 0)
                return -1;
            o[p] = SPAN_FAILED;
        }
    }
    return 0;
}

/* span_fill(ids, names, views, view_type, founds, at, units, gpus, spread, levels, found_max, check_over, kinds,
 * scores, jsons, host_json, reasons, no_room): (codes, written). Per position of `ids` (node ids; `names` the memo's
 * id -> name, `views` the state's name -> view, every one of view_type): WRITTEN (the cell written here: kind FITS,
 * its score, the node's kept text), FAILED (written here: FAILS, NO_ROOM's reason for a pod that fails now, from
 * no_room: spanning.no_room_texts(N), or None), SKIPPED (a verdict there already, or no view), CAPPED (check_over
 * and the view has elastic pods: the cap may decide), or span_code's code (a score whose text is not kept yet,
 * NO_ROOM, UNSEARCHED, GENERAL) for the caller to resolve; `written`: the cells written FITS. Bounded by the ids' count, every
 * id checked against the table and `names`, and span_code's bounds; no Python code runs (keys are ints, strs and a
 * tuple of them; the views' fields are slots read where the type keeps them). */
static PyObject *nameids_span_fill(PyObject *module, PyObject *args) {
    (void)module;
    SpanFill f = {0};
    PyObject *ids, *units, *out = NULL, *result = NULL;
    Py_buffer kinds, scores;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!OlpO!npw*w*O!O!O!O", &PyList_Type, &ids, &PyList_Type, &f.names,
                          &PyDict_Type, &f.views, &PyType_Type, &f.view_type, &PyDict_Type, &f.founds, &PyTuple_Type,
                          &f.at, &units, &f.gpus, &f.spread, &PyDict_Type, &f.levels, &f.found_max, &f.check_over,
                          &kinds, &scores, &PyList_Type, &f.jsons, &PyList_Type, &f.host_json, &PyList_Type,
                          &f.reasons, &f.no_room))
        return NULL;
    Py_ssize_t written = 0;
    f.kinds = kinds.buf;
    f.scores = scores.buf;
    if (!span_int(units, &f.units)) {
        PyErr_SetString(PyExc_ValueError, "span_fill: units must be an int within 2^52");
        goto done;
    }
    if (fill_check(&f, &kinds, &scores) < 0 || (f.gpus_obj = PyLong_FromLong(f.gpus)) == NULL)
        goto done;
    if ((out = PyBytes_FromStringAndSize(NULL, PyList_GET_SIZE(ids))) == NULL)
        goto done;
    if (fill_loop(&f, ids, (unsigned char *)PyBytes_AS_STRING(out), &written) == 0)
        result = Py_BuildValue("(On)", out, written);
done:
    Py_XDECREF(out);
    Py_XDECREF(f.gpus_obj);
    Py_XDECREF(f.last_topo);
    Py_XDECREF(f.plan);
    Py_XDECREF(f.last_text);
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&scores);
    return result;
}

/* ------------------------------------------------------------------ a table's fill by shared shapes (issue 34)
 * shared_fill is FitMemo._fill's loop while a table shares verdicts by node shape: per empty cell the node's shape
 * number (the memo's _sids), that shape's kept verdict (the table's `shared`: sid -> (fits, never, reason, score)),
 * the cell written with it (and, where it fits, the node's kept HostPriority text for the score). It stops at the
 * first cell it cannot write (a node without a shape number yet, a shape without a verdict): there the Python loop
 * numbers the shape or makes the verdict, which counts the sharing trial's misses and may stop the sharing, then
 * calls again from the next position, so every cell is written in the loop's order. Why: at 0 % full every node has
 * one shape and the spanning tables share verdicts; that loop cost ~2,700 instructions a cell in Python, the largest
 * part of the spanning mix's excess there (benchmarks/README.md, issue 34, eighth and ninth rounds). Kinds: */
#define SHARED_NEVER 3 /* fitmemo.NEVER (FITS: SPAN_FITS, FAILS: SPAN_KIND_FAILS) */

/* What a shared_fill call reads and counts: the table's arrays, the memo's per-id lists, the counts so far. */
typedef struct {
    unsigned char *kinds, *scores;
    PyObject *jsons, *reasons, *sids, *shared, *host_json;
    PyObject *texts;               /* ids whose fitting cell awaits its text (the caller's _fragment) */
    Py_ssize_t table_len, filled, fitting;
} SharedFill;

/* Why its own: the arguments checked once a call (the memo's own, yet nothing is trusted): 0, or -1 with a
 * TypeError or ValueError naming the bad one. */
static int shared_check(SharedFill *s, PyObject *const *a, Py_ssize_t nargs, Py_ssize_t *start) {
    if (nargs != 9 || !PyList_CheckExact(a[0]) || !PyByteArray_CheckExact(a[2]) || !PyByteArray_CheckExact(a[3])
        || !PyList_CheckExact(a[4]) || !PyList_CheckExact(a[5]) || !PyList_CheckExact(a[6])
        || !PyDict_CheckExact(a[7]) || !PyList_CheckExact(a[8])) {
        PyErr_SetString(PyExc_TypeError, "shared_fill(ids: list, start: int, kinds: bytearray, scores: bytearray, "
                                         "jsons: list, reasons: list, sids: list, shared: dict, host_json: list)");
        return -1;
    }
    *start = PyLong_CheckExact(a[1]) ? PyLong_AsSsize_t(a[1]) : -1;
    if (*start < 0 || *start > PyList_GET_SIZE(a[0])) {
        PyErr_Clear(); /* (an overflow) */
        PyErr_SetString(PyExc_ValueError, "shared_fill: start is not a position of ids");
        return -1;
    }
    s->kinds = (unsigned char *)PyByteArray_AS_STRING(a[2]);
    s->scores = (unsigned char *)PyByteArray_AS_STRING(a[3]);
    s->table_len = PyByteArray_GET_SIZE(a[2]);
    s->jsons = a[4], s->reasons = a[5], s->sids = a[6], s->shared = a[7], s->host_json = a[8];
    if (PyByteArray_GET_SIZE(a[3]) != s->table_len || PyList_GET_SIZE(s->jsons) != s->table_len
        || PyList_GET_SIZE(s->reasons) != s->table_len) {
        PyErr_Format(PyExc_ValueError, "shared_fill: a table of %zd kinds, %zd scores, %zd texts and %zd reasons",
                     s->table_len, PyByteArray_GET_SIZE(a[3]), PyList_GET_SIZE(s->jsons),
                     PyList_GET_SIZE(s->reasons));
        return -1;
    }
    if (PyList_GET_SIZE(s->sids) != PyList_GET_SIZE(s->host_json)) { /* the memo keeps both per id */
        PyErr_Format(PyExc_ValueError, "shared_fill: %zd shape numbers and %zd kept texts",
                     PyList_GET_SIZE(s->sids), PyList_GET_SIZE(s->host_json));
        return -1;
    }
    return 0;
}

/* Why a function: a kept verdict read as the loop reads it (fits, never, reason, score), so that nothing is written
 * from one malformed: an exact 4-tuple of two bools, a str reason where it fails, a score 0..MAX_SCORE where it fits.
 * 0, or -1 with a TypeError or ValueError. */
static int shared_verdict(PyObject *v, int *fits, int *never, PyObject **reason, long *score) {
    if (!PyTuple_CheckExact(v) || PyTuple_GET_SIZE(v) != 4 || !PyBool_Check(PyTuple_GET_ITEM(v, 0))
        || !PyBool_Check(PyTuple_GET_ITEM(v, 1))) {
        PyErr_SetString(PyExc_TypeError, "shared_fill: a kept verdict is not a (bool, bool, str, int) tuple");
        return -1;
    }
    *fits = PyTuple_GET_ITEM(v, 0) == Py_True;
    *never = PyTuple_GET_ITEM(v, 1) == Py_True;
    *reason = PyTuple_GET_ITEM(v, 2);
    if (!*fits) {
        if (!PyUnicode_CheckExact(*reason)) {
            PyErr_SetString(PyExc_TypeError, "shared_fill: a failing verdict's reason is not a str");
            return -1;
        }
        return 0;
    }
    PyObject *s = PyTuple_GET_ITEM(v, 3);
    *score = PyLong_CheckExact(s) ? PyLong_AsLong(s) : -1;
    if (*score < 0 || *score > SPAN_MAX_SCORE) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "shared_fill: a fitting verdict's score is not an int 0..%d", SPAN_MAX_SCORE);
        return -1;
    }
    return 0;
}

/* Why a function: one list item replaced (a cell's text or reason) where the old one is None or a str, so releasing
 * it runs no Python code; -1 a TypeError. */
static int shared_put(PyObject *list, Py_ssize_t i, PyObject *item) {
    PyObject *old = PyList_GET_ITEM(list, i);
    if (old != Py_None && !PyUnicode_CheckExact(old)) {
        PyErr_SetString(PyExc_TypeError, "shared_fill: a cell's text or reason is not a str or None");
        return -1;
    }
    PyList_SET_ITEM(list, i, Py_NewRef(item));
    Py_DECREF(old);
    return 0;
}

/* Why a function: a fitting cell's text, the node's kept one for that score (host_json[i]: None or a tuple of
 * texts by score, as FitMemo._fragment keeps them), else the id noted for the caller to make it (the cell's kind
 * and score written, its text left None). 0, or -1 an error set. */
static int shared_text(SharedFill *s, Py_ssize_t i, long score, PyObject *id) {
    PyObject *texts = PyList_GET_ITEM(s->host_json, i), *text = NULL;
    if (PyTuple_CheckExact(texts) && PyTuple_GET_SIZE(texts) > score)
        text = PyTuple_GET_ITEM(texts, score);
    else if (texts != Py_None && !PyTuple_CheckExact(texts)) {
        PyErr_SetString(PyExc_TypeError, "shared_fill: a node's kept texts are not a tuple or None");
        return -1;
    }
    if (text != NULL && PyUnicode_CheckExact(text))
        return shared_put(s->jsons, i, text);
    return PyList_Append(s->texts, id); /* (made before the loop: no new object here, so no collection) */
}

/* Why a function: the cell of node id i written with its shape's verdict v, as the Python loop writes it (FITS, the
 * score, the text; or NEVER / FAILS and the reason; nothing else); 0, or -1 an error set before any write. */
static int shared_write(SharedFill *s, Py_ssize_t i, PyObject *v, PyObject *id) {
    int fits, never;
    PyObject *reason;
    long score = 0;
    if (shared_verdict(v, &fits, &never, &reason, &score) < 0)
        return -1;
    if (!fits) {
        if (shared_put(s->reasons, i, reason) < 0)
            return -1;
        s->kinds[i] = never ? SHARED_NEVER : SPAN_KIND_FAILS;
        s->filled += 1;
        return 0;
    }
    PyObject *old = PyList_GET_ITEM(s->jsons, i);
    if (old != Py_None && !PyUnicode_CheckExact(old)) {
        PyErr_SetString(PyExc_TypeError, "shared_fill: a cell's text or reason is not a str or None");
        return -1;
    }
    if (shared_text(s, i, score, id) < 0)
        return -1;
    s->kinds[i] = SPAN_FITS;
    s->scores[i] = (unsigned char)score;
    s->filled += 1;
    s->fitting += 1;
    return 0;
}

/* Why its own: the loop over ids from `start`; the position where it stopped (len(ids): none left), or -1. It makes
 * no object (the texts list is made before it), so no collection runs code that could resize the arrays it holds. */
static Py_ssize_t shared_loop(SharedFill *s, PyObject *ids, Py_ssize_t start) {
    Py_ssize_t p = start, count = PyList_GET_SIZE(ids);
    for (; p < count; p++) {
        PyObject *id = PyList_GET_ITEM(ids, p);
        Py_ssize_t i = PyLong_CheckExact(id) ? PyLong_AsSsize_t(id) : -1;
        if (i < 0 || i >= s->table_len || i >= PyList_GET_SIZE(s->sids)) { /* (host_json: as long as sids) */
            PyErr_Clear(); /* (an overflow) */
            PyErr_Format(PyExc_IndexError, "shared_fill: the id at position %zd is not one of a table of %zd and "
                         "%zd shape numbers", p, s->table_len, PyList_GET_SIZE(s->sids));
            return -1;
        }
        if (s->kinds[i] != 0) /* (fitmemo.NONE) */
            continue;
        PyObject *sid = PyList_GET_ITEM(s->sids, i);
        if (sid == Py_None) /* no shape number since the view changed: the caller's _sid */
            break;
        if (!PyLong_CheckExact(sid)) { /* (an int key: looked up without Python code) */
            PyErr_SetString(PyExc_TypeError, "shared_fill: a shape number is not an int or None");
            return -1;
        }
        PyObject *v = PyDict_GetItemWithError(s->shared, sid);
        if (v == NULL) { /* a miss: the caller makes the verdict and counts it in the trial */
            if (PyErr_Occurred())
                return -1;
            break;
        }
        if (shared_write(s, i, v, id) < 0)
            return -1;
    }
    return p;
}

/* shared_fill(ids, start, kinds, scores, jsons, reasons, sids, shared, host_json): (stop, filled, fitting, texts). From position `start` of ids (node ids, repeats allowed), each empty cell of the table (kinds, scores,
 * jsons, reasons) whose node has a shape number (sids[i]) with a verdict in `shared` written as FitMemo._fill writes
 * it; it stops at the first empty cell it cannot write (stop: its position; len(ids) when none). filled and fitting:
 * the cells written (every one a hit of the sharing trial) and those that fit; texts: the ids of
 * fitting cells whose text for their score is not kept (kind and score written, the caller makes the text), or
 * None. Bounded by the ids' count; every id checked against the arrays; no Python code runs (shapes are ints, the
 * verdicts' items bools, strs and ints). Fast-call: it runs a few times per fill. */
static PyObject *nameids_shared_fill(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    SharedFill s = {0};
    Py_ssize_t start;
    if (shared_check(&s, args, nargs, &start) < 0 || (s.texts = PyList_New(0)) == NULL)
        return NULL;
    Py_ssize_t stop = shared_loop(&s, args[0], start); /* (the arrays' pointers held: nothing allocated inside) */
    PyObject *out = stop < 0 ? NULL : Py_BuildValue("(nnnO)", stop, s.filled, s.fitting,
                                                     PyList_GET_SIZE(s.texts) ? s.texts : Py_None);
    Py_DECREF(s.texts);
    return out;
}

/* ------------------------------------------------------------------ a failing filter's answer, whole (issue 34)
 * filter_answer writes filter's answer for a request whose NodeNames (a plain array, as ids_json reads it) the pod
 * fits only in part: the passing names' array and the rest of the ExtenderFilterResult, byte for byte what
 * orjson.dumps(wire.filter_result(...)) wrote from the decoded names and the memo's split (FitMemo._reasons). Why:
 * a pod spanning GPUs fails on some nodes of most requests; decoding its 500 names into strs, splitting them into
 * lists and dicts and encoding those again cost more than the rest of its filter (benchmarks/README.md, issue 34,
 * sixth round). Kinds as fitmemo's: */
#define ANSWER_FITS 1
#define ANSWER_FAILS 2
#define ANSWER_NEVER 3
#define ANSWER_FAILED_HEAD ",\"FailedNodes\":{"
#define ANSWER_NEVER_HEAD "},\"FailedAndUnresolvableNodes\":{"
#define ANSWER_END "},\"Error\":\"\"}"

/* A name of the request: its bytes in `data` (between its quotes), and what the answer does with it. */
typedef struct {
    const char *p;
    size_t len;
    unsigned char role; /* 0 none (a repeated failing name), 1 passed, 2 failed, 3 failed and unresolvable */
} AnswerName;

/* Why: a reason is copied into the answer only where orjson writes it as it is: an exact str of printable ASCII
 * without a quote or a backslash (the memo's texts; a node's inventory error may hold others: the caller's
 * Python writes those). 1 with its bytes; 0 otherwise. */
static int answer_reason(PyObject *r, const char **p, Py_ssize_t *n) {
    if (!PyUnicode_CheckExact(r) || !PyUnicode_IS_ASCII(r))
        return 0;
    *p = (const char *)PyUnicode_DATA(r);
    *n = PyUnicode_GET_LENGTH(r);
    return plain_run_end(*p, *p + *n) == *p + *n;
}

/* Why its own: the names of `data`, a JSON array of plain strings (as ids_json reads it), into `names`; 1 when it
 * is one with exactly `count` names, 0 otherwise (the caller's Python decodes it). */
static int answer_names(const char *p, const char *end, AnswerName *names, Py_ssize_t count) {
    Py_ssize_t k = 0;
    p = skip_ws(p, end);
    if (p >= end || *p != '[')
        return 0;
    p = skip_ws(p + 1, end);
    while (p < end && *p == '"' && k < count) { /* each name as next_name reads it, not hashed */
        const char *start = p + 1, *close = plain_run_end(start, end);
        if (close >= end || *close != '"' || !(p = after_string(close, end)))
            return 0;
        names[k].p = start;
        names[k++].len = (size_t)(close - start);
    }
    return k == count && p < end && *p == ']' && skip_ws(p + 1, end) == end;
}

/* Why its own: each name's role (passed: it fits, and with `best` its score is the highest of those that fit;
 * failed or unresolvable: the first time its id is met, as a dict keeps a key's first place) and the two parts'
 * sizes; 1, 0 where a kind is not a verdict or a reason cannot be copied (the caller's Python answers), -1 error. */
static int answer_roles(AnswerName *names, Py_ssize_t count, const uint32_t *ids, const unsigned char *kinds,
                        Py_buffer *scores, PyObject *reasons, int best, Py_ssize_t size[2], Py_ssize_t *kept) {
    int top = -1;
    uint32_t most = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        if (kinds[k] < ANSWER_FITS || kinds[k] > ANSWER_NEVER)
            return 0;
        most = ids[k] > most ? ids[k] : most;
        if (kinds[k] == ANSWER_FITS) {
            if ((Py_ssize_t)ids[k] >= scores->len) {
                id_error(ids[k], scores->len);
                return -1;
            }
            int score = ((const unsigned char *)scores->buf)[ids[k]];
            top = score > top ? score : top;
        }
    }
    unsigned char *seen = PyMem_Calloc((size_t)most / 8 + 1, 1);
    if (seen == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t passed = 0, failed[2] = {0, 0};
    int ok = 1;
    size[0] = 2; /* [] */
    size[1] = (Py_ssize_t)(sizeof ANSWER_FAILED_HEAD + sizeof ANSWER_NEVER_HEAD + sizeof ANSWER_END - 3);
    for (Py_ssize_t k = 0; k < count && ok == 1; k++) {
        uint32_t id = ids[k];
        names[k].role = 0;
        if (kinds[k] == ANSWER_FITS) {
            if (!best || ((const unsigned char *)scores->buf)[id] == top) {
                names[k].role = 1;
                size[0] += (Py_ssize_t)names[k].len + 2 + (passed++ > 0);
            }
            continue;
        }
        if (seen[id / 8] & (1u << (id % 8)))
            continue;
        seen[id / 8] |= (unsigned char)(1u << (id % 8));
        if ((Py_ssize_t)id >= PyList_GET_SIZE(reasons)) {
            id_error(id, PyList_GET_SIZE(reasons));
            ok = -1;
            break;
        }
        const char *r;
        Py_ssize_t n;
        if (!answer_reason(PyList_GET_ITEM(reasons, id), &r, &n)) {
            ok = 0;
            break;
        }
        int never = kinds[k] == ANSWER_NEVER;
        names[k].role = (unsigned char)(2 + never);
        size[1] += (Py_ssize_t)names[k].len + (Py_ssize_t)n + 5 + (failed[never]++ > 0); /* "name":"reason", */
    }
    PyMem_Free(seen);
    *kept = passed;
    return ok;
}

/* Why its own: the members of one object of the answer (FailedNodes: role 2, or FailedAndUnresolvableNodes: 3),
 * "name":"reason" in the names' order, from o; where they end. */
static char *answer_members(char *o, const AnswerName *names, Py_ssize_t count, const uint32_t *ids,
                            PyObject *reasons, unsigned char role) {
    int first = 1;
    for (Py_ssize_t k = 0; k < count; k++) {
        if (names[k].role != role)
            continue;
        PyObject *r = PyList_GET_ITEM(reasons, ids[k]);
        size_t n = (size_t)PyUnicode_GET_LENGTH(r);
        if (!first)
            *o++ = ',';
        first = 0;
        *o++ = '"';
        o = copy_name(o, names[k].p, names[k].len);
        memcpy(o, "\":\"", 3);
        memcpy(o + 3, PyUnicode_DATA(r), n);
        o += 3 + n;
        *o++ = '"';
    }
    return o;
}

/* Why its own: the two parts written, sized by answer_roles: the passing names' array (and their ids, packed)
 * and the rest of the answer after it. A tuple (names JSON, the rest, kept ids) or NULL with an error set. */
static PyObject *answer_write(const AnswerName *names, Py_ssize_t count, const uint32_t *ids, PyObject *reasons,
                              const Py_ssize_t size[2], Py_ssize_t kept) {
    PyObject *array = PyBytes_FromStringAndSize(NULL, size[0]), *rest = PyBytes_FromStringAndSize(NULL, size[1]);
    PyObject *packed = PyBytes_FromStringAndSize(NULL, kept * 4), *out = NULL;
    if (array != NULL && rest != NULL && packed != NULL) {
        char *o = PyBytes_AS_STRING(array);
        uint32_t *at = (uint32_t *)(void *)PyBytes_AS_STRING(packed);
        *o++ = '[';
        for (Py_ssize_t k = 0, j = 0; k < count; k++) {
            if (names[k].role != 1)
                continue;
            if (j++ > 0)
                *o++ = ',';
            *o++ = '"';
            o = copy_name(o, names[k].p, names[k].len);
            *o++ = '"';
            *at++ = ids[k];
        }
        *o = ']';
        o = PyBytes_AS_STRING(rest);
        memcpy(o, ANSWER_FAILED_HEAD, sizeof ANSWER_FAILED_HEAD - 1);
        o = answer_members(o + sizeof ANSWER_FAILED_HEAD - 1, names, count, ids, reasons, 2);
        memcpy(o, ANSWER_NEVER_HEAD, sizeof ANSWER_NEVER_HEAD - 1);
        o = answer_members(o + sizeof ANSWER_NEVER_HEAD - 1, names, count, ids, reasons, 3);
        memcpy(o, ANSWER_END, sizeof ANSWER_END - 1);
        out = PyTuple_Pack(3, array, rest, packed);
    }
    Py_XDECREF(array);
    Py_XDECREF(rest);
    Py_XDECREF(packed);
    return out;
}

/* filter_answer(data, ids, kinds, scores, reasons, best): (the passing names' JSON array, the rest of the answer
 * after it, their ids packed) for the names of `data` (a JSON array of plain strings; ids[k] the k-th name's id,
 * kinds[k] its verdict's kind), such that b'{"Nodes":null,"NodeNames":' + array + rest is orjson's encoding of
 * wire.filter_result for that split; None where `data` is not such an array of as many names as `ids`, a kind is
 * not a verdict, or a reason is not plain (the caller's Python answers). `scores` and `reasons`: the table's, by
 * id (every id read checked against them). Bounded by the ids' count; no Python code runs. */
static PyObject *nameids_filter_answer(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer data, packed, kinds, scores;
    PyObject *reasons, *out = NULL;
    int best;
    if (!PyArg_ParseTuple(args, "y*y*y*y*O!p", &data, &packed, &kinds, &scores, &PyList_Type, &reasons, &best))
        return NULL;
    const uint32_t *ids;
    Py_ssize_t count, size[2], kept = 0;
    AnswerName *names = NULL;
    if (read_ids(&packed, &ids, &count) < 0)
        goto done;
    if (kinds.len != count) {
        PyErr_Format(PyExc_ValueError, "filter_answer: %zd kinds for %zd ids", kinds.len, count);
        goto done;
    }
    if ((names = PyMem_Malloc(((size_t)count + 1) * sizeof *names)) == NULL) { /* every field set before read */
        PyErr_NoMemory();
        goto done;
    }
    int ok = answer_names(data.buf, (const char *)data.buf + data.len, names, count);
    if (ok == 1)
        ok = answer_roles(names, count, ids, kinds.buf, &scores, reasons, best, size, &kept);
    if (ok == 1)
        out = answer_write(names, count, ids, reasons, size, kept);
    else if (ok == 0)
        out = Py_NewRef(Py_None);
done:
    PyMem_Free(names);
    PyBuffer_Release(&data);
    PyBuffer_Release(&packed);
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&scores);
    return out;
}

static PyMethodDef index_methods[] = {
    {"set", index_set, METH_VARARGS, "set(name, id): hold name -> id (a name that is not ASCII is not held)"},
    {"discard", index_discard, METH_O, "discard(name): forget the name if held"},
    {"ids", index_ids, METH_O, "ids(names): the names' ids packed as uint32 bytes, or None if one is not held"},
    {"ids_json", index_ids_json, METH_VARARGS,
     "ids_json(data, limit): ids() of the names in a JSON array of plain strings (bytes); None if it is not "
     "one, has more than limit names, or one is not held"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods index_as_sequence = {.sq_length = index_len};

static PyTypeObject NameIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memslice.scheduler_extender.index._nameids.NameIndex",
    .tp_doc = "NameIndex(seed): node name -> node id, for ids() of a whole list of names at once",
    .tp_basicsize = sizeof(NameIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = index_init,
    .tp_dealloc = index_dealloc,
    .tp_methods = index_methods,
    .tp_as_sequence = &index_as_sequence,
};

static PyMethodDef module_methods[] = {
    {"take", nameids_take, METH_VARARGS, "take(table, ids): bytes(table[i] for i in ids)"},
    {"span_fill", nameids_span_fill, METH_VARARGS,
     "span_fill(ids, names, views, view_type, founds, at, units, gpus, spread, levels, found_max, check_over, "
     "kinds, scores, jsons, host_json): a spanning table's empty cells written where they fit; (codes, written)"},
    {"shared_fill", (PyCFunction)(void (*)(void))nameids_shared_fill, METH_FASTCALL,
     "shared_fill(ids, start, kinds, scores, jsons, reasons, sids, shared, host_json): a table's empty cells written "
     "from their shapes' kept verdicts up to the first it cannot write; (stop, filled, fitting, texts)"},
    {"filter_answer", nameids_filter_answer, METH_VARARGS,
     "filter_answer(data, ids, kinds, scores, reasons, best): (passing names' JSON array, the answer's rest, their "
     "ids) for a filter that fails on some names; None where its Python answers"},
    {"gather", nameids_gather, METH_VARARGS, "gather(items, ids): [items[i] for i in ids]"},
    {"select", nameids_select, METH_VARARGS, "select(ids, mask): the ids whose mask byte is not 0"},
    {"same", nameids_same, METH_VARARGS, "same(a, b): a == b for lists of exact strs; None if an item is not one"},
    {"join", nameids_join, METH_VARARGS,
     "join(texts, ids): b'[' + b','.join(texts[i] for i in ids) + b']', or None if a text is not ASCII str"},
    {"hosts_json", nameids_hosts_json, METH_VARARGS,
     "hosts_json(data, ids, kinds, scores, fits): HostPriorityList JSON of the names in data, scored "
     "scores[ids[k]]; None unless every kinds[ids[k]] is fits"},
    {"span_scores", nameids_span_scores, METH_VARARGS,
     "span_scores(keys, chosen, needs, gpus, spread, search=None): spanning.scores natively, the missing set "
     "searches made where `search` is given; None where it cannot be exact"},
    {"name_hash", nameids_name_hash, METH_VARARGS,
     "name_hash(seed, name): the hash an ASCII str is held under in NameIndex(seed); None for anything else"},
    {"span_scores_each", nameids_span_scores_each, METH_VARARGS,
     "span_scores_each(keys_of, chosen_of, need, gpus, spread): span_scores for one need on each node"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, .m_name = "memslice.scheduler_extender.index._nameids",
    .m_doc = "Node name -> id and the reads by ids of the extender's memo (see nameids.py).", .m_size = -1,
    .m_methods = module_methods,
};

static int add_span_refresh(PyObject *m); /* the memo's refresh of spanning tables, at the end of the file */

/* Why the module init only readies the type: the module holds no state (each NameIndex has its own). */
PyMODINIT_FUNC PyInit__nameids(void) {
    if (PyType_Ready(&NameIndexType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "NameIndex", (PyObject *)&NameIndexType) < 0
        || PyModule_AddIntConstant(m, "NAMES_SIMD", NAMES_SSE2) < 0 /* which scan this build uses */
        || add_span_refresh(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/* ------------------------------------------------------------------ the memo's refresh of spanning tables natively
 * FitMemo._refresh_groups (issue 34): at every bind the memo refreshes the bound node's cell in each spanning table
 * of one N and policy (10 per group in benchmarks/README.md's mix). In Python each cell cost a loop step, a compare
 * and a write, and the change check a tuple of the view's columns: ~0.16 M instructions a bind. Here one call per
 * group computes each held cell's code (span_code) and writes the cells that still fit (their score and its JSON
 * text), leaving to Python only the cells that need a verdict's reason (spanning.resolve), a set search the C
 * cannot make, or a text not made yet. Kinds as fitmemo's: */
#define SPAN_KIND_NONE 0
#define SPAN_KIND_FITS 1
#define SPAN_MAX_CELLS 255 /* a group's tables (fitmemo.MAX_TABLES is 64): a member's position fits a byte */
#define SPAN_KEEP 0xFF     /* a cell that keeps its verdict: neither computed nor written */

/* Why a function: a spanning cell's arrays (size, kinds, scores, jsons, reasons) checked once per call, so the loops
 * below index them without a check each: 1; -1 a TypeError or IndexError set (the memo's own plan malformed). */
static int span_cell_check(PyObject *cell, Py_ssize_t i) {
    if (!PyTuple_CheckExact(cell) || PyTuple_GET_SIZE(cell) != 5 || !PyByteArray_CheckExact(PyTuple_GET_ITEM(cell, 1))
        || !PyByteArray_CheckExact(PyTuple_GET_ITEM(cell, 2)) || !PyList_CheckExact(PyTuple_GET_ITEM(cell, 3))
        || !PyList_CheckExact(PyTuple_GET_ITEM(cell, 4))) {
        PyErr_SetString(PyExc_TypeError, "span_refresh: a cell is not (size, kinds: bytearray, scores: bytearray, "
                        "jsons: list, reasons: list)");
        return -1;
    }
    if (PyByteArray_GET_SIZE(PyTuple_GET_ITEM(cell, 1)) <= i || PyByteArray_GET_SIZE(PyTuple_GET_ITEM(cell, 2)) <= i
        || PyList_GET_SIZE(PyTuple_GET_ITEM(cell, 3)) <= i || PyList_GET_SIZE(PyTuple_GET_ITEM(cell, 4)) <= i) {
        PyErr_Format(PyExc_IndexError, "span_refresh: node id %zd outside a cell's arrays", i);
        return -1;
    }
    return 1;
}

/* Why a function: a cell's need (its per-GPU size × the node's unit, what the Python path computes) where both are
 * exact and so is the product: 1; 0 where not (the caller answers None: the Python path refreshes the group). */
static int span_need(PyObject *size, int64_t unit, int64_t *need) {
    int64_t s;
    if (!span_int(size, &s))
        return 0;
    int64_t bound = unit == 0 ? SPAN_EXACT : (SPAN_EXACT - 1) / (unit < 0 ? -unit : unit);
    if (s > bound || s < -bound)
        return 0;
    *need = s * unit;
    return 1;
}

/* What one span_refresh call decodes once for all its cells: the view's free column, its rows (for the set
 * searches: each GPU's free fraction, the positions of the free order) and the chosen sets met (by k, at most
 * SPAN_SLOTS of them; more are decoded again per cell). Why: a group's ten cells bisect one column and land on two
 * or three k's, and every search read every row: decoding the same ints again was most of the call. */
#define SPAN_SLOTS 8
typedef struct {
    Py_ssize_t k;
    double close;
    int64_t free_mib[SPAN_MAX_GPUS], mem[SPAN_MAX_GPUS];
} SpanSet;

typedef struct {
    int64_t keys[SPAN_MAX_GPUS];
    Py_ssize_t nkeys;
    SpanSet sets[SPAN_SLOTS];
    int used;
    /* the searches: rows, free_rows, by_mask (a dict), closes, levels; rows_state 0 not read yet, 1 read, -1 none */
    PyObject *rows, *free_rows, *by_mask, *closes, *levels;
    int rows_state, fractions_ok;
    double fraction[SPAN_MAX_GPUS];
    int64_t position[SPAN_MAX_GPUS]; /* free_rows[j]'s position in rows (its index: index = position) */
} SpanCache;

/* Why a function: the view's free column as int64s (at most SPAN_MAX_GPUS of them): 1; 0 where a key is not exact
 * or there are more (the caller answers None: the Python path refreshes the group). */
static int span_cache_keys(SpanCache *c, PyObject *keys) {
    c->nkeys = PyTuple_GET_SIZE(keys);
    c->used = 0;
    c->rows_state = c->by_mask == NULL ? -1 : 0;
    if (c->nkeys > SPAN_MAX_GPUS)
        return 0;
    for (Py_ssize_t j = 0; j < c->nkeys; j++)
        if (!span_int(PyTuple_GET_ITEM(keys, j), &c->keys[j]))
            return 0;
    return 1;
}

/* Why its own: span_bisect's probes over the decoded column (the same lo/hi/mid: the same k as bisect_left). */
static Py_ssize_t span_cache_bisect(const SpanCache *c, int64_t need) {
    Py_ssize_t lo = 0, hi = c->nkeys;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (c->keys[mid] < need)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Why a function: the rows read once for the searches (span_search's reads: every row a GpuRow of exact ints whose
 * index is its position, every free row's index a position); rows_state -1 where one is not (no search here: the
 * cells go UNSEARCHED to the reference). fractions_ok 0 where a GPU has 0 MiB (span_pick leaves it to the reference
 * where sets tie on more than one). */
static void span_cache_rows(SpanCache *c) {
    Py_ssize_t n = PyTuple_GET_SIZE(c->rows), m = PyTuple_GET_SIZE(c->free_rows);
    c->rows_state = -1;
    c->fractions_ok = 1;
    if (n > SPAN_MAX_GPUS || m > SPAN_MAX_GPUS)
        return;
    for (Py_ssize_t p = 0; p < n; p++) {
        int64_t index, mem, free_mib;
        if (!span_row(c->rows, p, &index, &mem, &free_mib) || index != p)
            return;
        if (mem == 0)
            c->fractions_ok = 0;
        else
            c->fraction[p] = (double)free_mib / (double)mem;
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *r = PyTuple_GET_ITEM(c->free_rows, j);
        if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) < 7 || !span_int(PyTuple_GET_ITEM(r, 1), &c->position[j])
            || c->position[j] < 0 || c->position[j] >= n)
            return;
    }
    c->rows_state = 1;
}

/* Why a function: the flat chosen set (closeness, then each GPU's free MiB and MiB: spanning.Found) of `positions`,
 * the rows' own ints. *out a new reference; 1; 0 a position not exact; -1 an error set. */
static int span_cache_chosen(const SpanCache *c, PyObject *positions, PyObject *close, long gpus, PyObject **out) {
    if (!PyTuple_CheckExact(positions) || PyTuple_GET_SIZE(positions) != gpus) {
        PyErr_Format(PyExc_TypeError, "span_refresh: a fitting set is not a tuple of %ld positions", gpus);
        return -1;
    }
    PyObject *chosen = PyTuple_New(1 + 2 * gpus);
    if (chosen == NULL)
        return -1;
    Py_INCREF(close);
    PyTuple_SET_ITEM(chosen, 0, close);
    for (long g = 0; g < gpus; g++) {
        int64_t p;
        if (!span_int(PyTuple_GET_ITEM(positions, g), &p) || p < 0 || p >= PyTuple_GET_SIZE(c->rows)) {
            Py_DECREF(chosen);
            return 0;
        }
        PyObject *r = PyTuple_GET_ITEM(c->rows, p), *f = PyTuple_GET_ITEM(r, 6), *m = PyTuple_GET_ITEM(r, 3);
        Py_INCREF(f);
        Py_INCREF(m);
        PyTuple_SET_ITEM(chosen, 1 + 2 * g, f);
        PyTuple_SET_ITEM(chosen, 2 + 2 * g, m);
    }
    *out = chosen;
    return 1;
}

#define SPAN_MAX_MASKS 4096 /* spanning.MAX_MASKS: masks kept per topology and N (emptied when full) */

/* Why a function: the sets of one level (members: ((mask, positions), ...)) whose GPUs are all in `mask`, as a new
 * tuple of their positions (empty: none); NULL with *ok 0 where a member is malformed (the reference scans), or an
 * error set (*ok -1). */
static PyObject *span_level_fitting(PyObject *members, uint64_t mask, int *ok) {
    Py_ssize_t n = PyTuple_GET_SIZE(members), count = 0;
    *ok = 0;
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        PyObject *out = pass ? PyTuple_New(count) : NULL;
        if (pass && out == NULL) {
            *ok = -1;
            return NULL;
        }
        Py_ssize_t at = 0;
        for (Py_ssize_t j = 0; j < n; j++) {
            PyObject *member = PyTuple_GET_ITEM(members, j);
            if (!PyTuple_CheckExact(member) || PyTuple_GET_SIZE(member) != 2
                || !PyLong_CheckExact(PyTuple_GET_ITEM(member, 0))) {
                Py_XDECREF(out);
                return NULL;
            }
            unsigned long long m = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(member, 0));
            if (m == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                Py_XDECREF(out);
                return NULL;
            }
            if ((m & mask) != m)
                continue;
            if (pass) {
                PyObject *pos = PyTuple_GET_ITEM(member, 1);
                Py_INCREF(pos);
                PyTuple_SET_ITEM(out, at++, pos);
            } else
                count++;
        }
        if (pass) {
            *ok = 1;
            return out;
        }
    }
    return NULL; /* (not reached) */
}

/* Why a function: spanning._closest for a mask by_mask lacks, natively: the closest level with a set whose GPUs are
 * all in `mask`, kept in by_mask as (distance, sets) (the levels' own objects) and answered (borrowed). NULL with no
 * error where no level fits or a level is malformed (the reference scans: it keeps what it finds); an error set. */
static PyObject *span_closest(PyObject *levels, PyObject *by_mask, PyObject *key, uint64_t mask) {
    for (Py_ssize_t l = 0; l < PyTuple_GET_SIZE(levels); l++) {
        PyObject *level = PyTuple_GET_ITEM(levels, l);
        if (!PyTuple_CheckExact(level) || PyTuple_GET_SIZE(level) != 2 || !PyLong_CheckExact(PyTuple_GET_ITEM(level, 0))
            || !PyTuple_CheckExact(PyTuple_GET_ITEM(level, 1)))
            return NULL;
        int ok;
        PyObject *fitting = span_level_fitting(PyTuple_GET_ITEM(level, 1), mask, &ok);
        if (fitting == NULL)
            return NULL;
        if (PyTuple_GET_SIZE(fitting) == 0) {
            Py_DECREF(fitting);
            continue;
        }
        PyObject *hit = PyTuple_Pack(2, PyTuple_GET_ITEM(level, 0), fitting);
        Py_DECREF(fitting);
        if (hit == NULL)
            return NULL;
        if (PyDict_GET_SIZE(by_mask) >= SPAN_MAX_MASKS)
            PyDict_Clear(by_mask); /* (ints and tuples of ints released: no Python code runs) */
        int set = PyDict_SetItem(by_mask, key, hit);
        Py_DECREF(hit); /* by_mask holds it */
        return set < 0 ? NULL : hit;
    }
    return NULL;
}

/* Why its own: span_search on the rows read once (span_cache_rows): the mask of the positions with room (free order
 * from k on), its closest fitting sets as spanning._closest kept them (read only: a mask not kept is the
 * reference's), the policy's pick, the flat chosen set. 1 with *out (a new reference); 0 the reference searches;
 * -1 an error set. */
static int span_cache_search(SpanCache *c, Py_ssize_t k, long gpus, int spread, PyObject **out) {
    if (c->rows_state == 0)
        span_cache_rows(c);
    if (c->rows_state < 0)
        return 0;
    uint64_t mask = 0;
    for (Py_ssize_t j = k; j < PyTuple_GET_SIZE(c->free_rows); j++)
        mask |= (uint64_t)1 << c->position[j];
    PyObject *key = PyLong_FromUnsignedLongLong(mask);
    if (key == NULL)
        return -1;
    PyObject *hit = PyDict_GetItemWithError(c->by_mask, key); /* borrowed; ints hash and compare without Python code */
    if (hit == NULL && !PyErr_Occurred() && c->levels != NULL)
        hit = span_closest(c->levels, c->by_mask, key, mask); /* borrowed from by_mask */
    Py_DECREF(key);
    if (hit == NULL)
        return PyErr_Occurred() ? -1 : 0;
    int64_t d;
    PyObject *positions = NULL;
    int usable = span_hit_positions(hit, c->closes, c->rows, c->fractions_ok ? c->fraction : NULL, gpus, spread,
                                    "span_refresh", &d, &positions); /* (NULL: span_pick leaves a 0 MiB GPU's) */
    if (usable != 1)
        return usable;
    return span_cache_chosen(c, positions, PyTuple_GET_ITEM(c->closes, d), gpus, out);
}

/* Why a function: chosen set `at` (a checked tuple of 1 + 2 × gpus items) decoded into *set up to its first GPU of
 * 0 MiB or less (span_score reads no further): 1; 0 not exact; -1 a TypeError set (as span_score). */
static int span_set_decode(PyObject *at, long gpus, SpanSet *set) {
    PyObject *close = PyTuple_GET_ITEM(at, 0);
    if (!PyFloat_CheckExact(close)) {
        PyErr_SetString(PyExc_TypeError, "span_refresh: a chosen set's closeness is not a float");
        return -1;
    }
    set->close = PyFloat_AS_DOUBLE(close);
    for (long g = 0; g < gpus; g++) {
        if (!span_int(PyTuple_GET_ITEM(at, 1 + 2 * g), &set->free_mib[g])
            || !span_int(PyTuple_GET_ITEM(at, 2 + 2 * g), &set->mem[g]))
            return 0;
        if (set->mem[g] <= 0)
            break;
    }
    return 1;
}

/* Why a function: span_score's arithmetic on a decoded set (the same operations in the same order: the same
 * doubles, the same code as spanning.scores). */
static unsigned char span_set_score(const SpanSet *set, int64_t need, long gpus, int spread) {
    double left = 0.0;
    for (long g = 0; g < gpus; g++) {
        if (set->mem[g] <= 0)
            return SPAN_GENERAL;
        left += (double)(set->free_mib[g] - need) / (double)set->mem[g];
    }
    left /= (double)gpus;
    double scaled = (double)SPAN_MAX_SCORE * (set->close + 0.25 * (spread ? left : 1.0 - left));
    if (!isfinite(scaled))
        return SPAN_GENERAL;
    double r = span_round(scaled);
    return (unsigned char)(r < 0.0 ? 0 : r > (double)SPAN_MAX_SCORE ? SPAN_MAX_SCORE : (int)r);
}

/* Why a function: one need's code as span_code answers it, from the decoded column and sets (the set search of k
 * made first where the call has a search and `chosen` lacks it, and kept there). 1 with *code; 0 not exact; -1
 * an error set. */
static int span_cache_code(SpanCache *c, PyObject *chosen, int64_t need, long gpus, int spread, unsigned char *code) {
    Py_ssize_t k = span_cache_bisect(c, need);
    if (c->nkeys - k < gpus) {
        *code = SPAN_NO_ROOM;
        return 1;
    }
    for (int s = 0; s < c->used; s++)
        if (c->sets[s].k == k) {
            *code = span_set_score(&c->sets[s], need, gpus, spread);
            return 1;
        }
    if (k >= PyList_GET_SIZE(chosen)) {
        PyErr_Format(PyExc_IndexError, "span_refresh: k %zd outside the chosen sets (%zd)", k, PyList_GET_SIZE(chosen));
        return -1;
    }
    PyObject *at = PyList_GET_ITEM(chosen, k);
    if (at == Py_None && c->rows_state >= 0) {
        PyObject *found = NULL;
        int ok = span_cache_search(c, k, gpus, spread, &found);
        if (ok < 0)
            return -1;
        if (ok == 1) {
            if (PyList_SetItem(chosen, k, found) < 0) /* steals `found`; releases the None */
                return -1;
            at = found;
        }
    }
    if (at == Py_None || at == Py_False) {
        *code = at == Py_None ? SPAN_UNSEARCHED : SPAN_GENERAL;
        return 1;
    }
    if (!PyTuple_CheckExact(at) || PyTuple_GET_SIZE(at) != 1 + 2 * gpus) {
        PyErr_Format(PyExc_TypeError, "span_refresh: chosen set %zd is not None, False or a tuple of %ld items", k,
                     1 + 2 * gpus);
        return -1;
    }
    SpanSet one, *set = c->used < SPAN_SLOTS ? &c->sets[c->used] : &one;
    int ok = span_set_decode(at, gpus, set);
    if (ok != 1)
        return ok;
    set->k = k;
    if (set != &one)
        c->used++;
    *code = span_set_score(set, need, gpus, spread);
    return 1;
}

/* Why phase one apart: every held cell's code computed before any is written, so an answer of None (a value not
 * exact) leaves every cell as it was for the Python path. codes[j]: the code or SPAN_KEEP. 1; 0 None; -1 error. */
static int span_refresh_codes(SpanCache *c, PyObject *cells, Py_ssize_t i, int64_t unit, int64_t above,
                              PyObject *keys, PyObject *chosen, long gpus, int spread, unsigned char *codes,
                              int64_t *needs) {
    if (!span_cache_keys(c, keys))
        return 0;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(cells); j++) {
        PyObject *cell = PyTuple_GET_ITEM(cells, j);
        int64_t need;
        codes[j] = SPAN_KEEP;
        if ((unsigned char)PyByteArray_AS_STRING(PyTuple_GET_ITEM(cell, 1))[i] == SPAN_KIND_NONE)
            continue; /* no verdict held: filled when asked */
        if (!span_need(PyTuple_GET_ITEM(cell, 0), unit, &need))
            return 0;
        if (need > above)
            continue; /* above every free MiB that changed: the same verdict (FitMemo._refresh_groups) */
        needs[j] = need;
        int ok = span_cache_code(c, chosen, need, gpus, spread, &codes[j]);
        if (ok != 1)
            return ok;
    }
    return 1;
}

/* What phase two reads besides the cells: the node's texts per score (or NULL), its rows and the NO_ROOM reasons
 * (spanning.no_room_texts(N), or NULL), N, and `same`. */
typedef struct {
    PyObject *texts, *rows, *no_room;
    long gpus;
    int same;
} SpanWrites;

/* Why a function: a NO_ROOM cell of phase two: left where it failed and the view changed only in free MiB; written
 * failing where the pod fails now and its reason is kept (span_no_room_text). 1 done (*unfit: it fitted before,
 * the caller's Python counts it); 0 left to Python; -1 an error set. */
static int span_refresh_no_room(const SpanWrites *w, PyObject *cell, Py_ssize_t i, int64_t need, int *unfit) {
    unsigned char *kinds = (unsigned char *)PyByteArray_AS_STRING(PyTuple_GET_ITEM(cell, 1));
    *unfit = kinds[i] == SPAN_KIND_FITS;
    if (w->same && !*unfit)
        return 1;
    PyObject *text = NULL;
    int got = w->no_room != NULL ? span_no_room_text(w->rows, need, w->gpus, w->no_room, &text) : 0;
    if (got != 1)
        return got;
    return span_write_fails(kinds, (unsigned char *)PyByteArray_AS_STRING(PyTuple_GET_ITEM(cell, 2)),
                            PyTuple_GET_ITEM(cell, 4), PyTuple_GET_ITEM(cell, 3), i, text);
}

/* Why phase two apart: the writes. A cell that fitted and fits with the same score is left; one that fitted and
 * fits with another gets that score and the node's text for it (texts[code], a str) in place of the old one (a str
 * or None: no other object is released here, so no Python code runs). A failing cell that still finds too few GPUs
 * with room on a view where only free MiB changed (same) is left; a NO_ROOM cell whose pod fails now is written
 * failing with its kept reason (span_refresh_no_room; one that fitted goes to `todo` as (position, FAILED): the
 * fitting count is Python's). Every other cell goes to `todo` as (position, code) for Python. 1; -1 an error set. */
static int span_refresh_write(PyObject *cells, Py_ssize_t i, const unsigned char *codes, const int64_t *needs,
                              const SpanWrites *w, unsigned char *todo, Py_ssize_t *count) {
    PyObject *texts = w->texts;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(cells); j++) {
        unsigned char code = codes[j];
        if (code == SPAN_KEEP)
            continue;
        PyObject *cell = PyTuple_GET_ITEM(cells, j);
        if (span_cell_check(cell, i) < 0) /* again: emptying a full by_mask (span_closest) released objects */
            return -1;
        unsigned char *kinds = (unsigned char *)PyByteArray_AS_STRING(PyTuple_GET_ITEM(cell, 1));
        unsigned char *scores = (unsigned char *)PyByteArray_AS_STRING(PyTuple_GET_ITEM(cell, 2));
        PyObject *jsons = PyTuple_GET_ITEM(cell, 3);
        if (code <= SPAN_MAX_SCORE && kinds[i] == SPAN_KIND_FITS) {
            if (scores[i] == code)
                continue;
            PyObject *text = texts != NULL ? PyTuple_GET_ITEM(texts, code) : NULL;
            PyObject *old = PyList_GET_ITEM(jsons, i);
            if (old != Py_None && !PyUnicode_CheckExact(old)) {
                PyErr_SetString(PyExc_TypeError, "span_refresh: a cell's JSON is not a str or None");
                return -1;
            }
            if (text != NULL && PyUnicode_CheckExact(text)) {
                scores[i] = code;
                Py_INCREF(text);
                PyList_SET_ITEM(jsons, i, text);
                Py_DECREF(old);
                continue;
            }
        } else if (code == SPAN_NO_ROOM) {
            int unfit, done = span_refresh_no_room(w, cell, i, needs[j], &unfit);
            if (done < 0)
                return -1;
            if (done && !unfit)
                continue;
            if (done)
                code = SPAN_FAILED;
        }
        todo[2 * *count] = (unsigned char)j;
        todo[2 * *count + 1] = code;
        (*count)++;
    }
    return 1;
}

/* Why a function: span_refresh's arguments checked (types, ranges, every cell's arrays), so the loops index without
 * checks. 1; -1 an error set naming the bad one. */
static int span_refresh_args(PyObject *const *a, Py_ssize_t nargs, Py_ssize_t *i, long *gpus, int64_t *above) {
    if (nargs != 17) {
        PyErr_Format(PyExc_TypeError, "span_refresh takes 17 arguments (%zd given)", nargs);
        return -1;
    }
    if (!PyTuple_CheckExact(a[15]) || (a[16] != Py_None && !PyDict_CheckExact(a[16]))) {
        PyErr_SetString(PyExc_TypeError, "span_refresh: view_rows must be a tuple, no_room a dict or None");
        return -1;
    }
    if (!PyTuple_CheckExact(a[1]) || !PyList_CheckExact(a[2]) || !PyTuple_CheckExact(a[3])) {
        PyErr_SetString(PyExc_TypeError, "span_refresh: keys must be a tuple, chosen a list, cells a tuple");
        return -1;
    }
    if (a[6] != Py_None && (!PyTuple_CheckExact(a[6]) || !PyTuple_CheckExact(a[7]) || !PyDict_CheckExact(a[8])
                            || !PyTuple_CheckExact(a[9]) || (a[14] != Py_None && !PyTuple_CheckExact(a[14])))) {
        PyErr_SetString(PyExc_TypeError, "span_refresh: rows, free_rows, by_mask, closes, levels must be tuple, tuple, "
                        "dict, tuple, tuple or None (or rows None: no search)");
        return -1;
    }
    if (a[10] != Py_None && (!PyTuple_CheckExact(a[10]) || PyTuple_GET_SIZE(a[10]) != SPAN_MAX_SCORE + 1)) {
        PyErr_Format(PyExc_TypeError, "span_refresh: texts must be None or a tuple of %d", SPAN_MAX_SCORE + 1);
        return -1;
    }
    if (!PyLong_CheckExact(a[0]) || !PyLong_CheckExact(a[4]) || !PyLong_CheckExact(a[11]) || !PyBool_Check(a[5])
        || !PyBool_Check(a[12])) {
        PyErr_SetString(PyExc_TypeError, "span_refresh: i, gpus and above must be ints, spread and same bools");
        return -1;
    }
    long long at;
    *i = PyLong_AsSsize_t(a[0]);
    *gpus = PyLong_AsLong(a[4]);
    at = PyLong_AsLongLong(a[11]);
    if (PyErr_Occurred())
        return -1;
    *above = (int64_t)at;
    if (*gpus < 1 || *gpus > SPAN_MAX_GPUS || *i < 0 || PyTuple_GET_SIZE(a[3]) > SPAN_MAX_CELLS) {
        PyErr_Format(PyExc_ValueError, "span_refresh: gpus %ld outside 1..%d, node id %zd below 0 or more than %d "
                     "cells (%zd)", *gpus, SPAN_MAX_GPUS, *i, SPAN_MAX_CELLS, PyTuple_GET_SIZE(a[3]));
        return -1;
    }
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(a[3]); j++)
        if (span_cell_check(PyTuple_GET_ITEM(a[3], j), *i) < 0)
            return -1;
    return 1;
}

/* span_refresh(i, keys, chosen, cells, gpus, spread, rows, free_rows, by_mask, closes, texts, above, same, unit,
 * levels, view_rows, no_room): FitMemo._refresh_groups for one group (N, policy) on node id i natively. keys: the
 * view's free column (free_keys); chosen: the group's set searches for this view (spanning.Found's list; searches
 * made here are kept in it); cells: per table of the group (size per GPU, kinds, scores, jsons, reasons); rows (None:
 * no search here), free_rows, view_rows: the view's; no_room: spanning.no_room_texts(N) or None (the reasons of
 * NO_ROOM cells that fail now, written here: span_refresh_no_room); by_mask,
 * closes, levels: spanning._plan's for its topology and N (rows None: no search here, as span_scores without one;
 * a mask by_mask lacks is looked for in the levels, as spanning._closest, and kept there; levels None: left to
 * the reference); texts:
 * the node's HostPriority JSON per score (a tuple of MAX_SCORE + 1 str or None, or None); cells whose need is above
 * `above` keep their verdicts, and with `same` the failing ones that still find no room. Answers bytes of
 * (position in cells, code) pairs left to Python, or None where a value is not exact (nothing written: the Python
 * path refreshes the group). Fast-call (no argument tuple: it runs at every bind, per group). Bounded by the cells
 * (at most SPAN_MAX_CELLS), the rows and keys (at most SPAN_MAX_GPUS) and each tuple's checked length; no Python
 * code runs. */
static PyObject *nameids_span_refresh(PyObject *module, PyObject *const *a, Py_ssize_t nargs) {
    (void)module;
    Py_ssize_t i;
    long gpus;
    int64_t above, unit;
    if (span_refresh_args(a, nargs, &i, &gpus, &above) < 0)
        return NULL;
    int spread = a[5] == Py_True, same = a[12] == Py_True;
    SpanCache cache;
    cache.rows = a[6] == Py_None ? NULL : a[6];
    cache.free_rows = a[7];
    cache.by_mask = cache.rows == NULL ? NULL : a[8];
    cache.closes = a[9];
    cache.levels = a[14] == Py_None ? NULL : a[14];
    unsigned char codes[SPAN_MAX_CELLS], todo[2 * SPAN_MAX_CELLS];
    int64_t needs[SPAN_MAX_CELLS];
    int ok = span_int(a[13], &unit) ? span_refresh_codes(&cache, a[3], i, unit, above, a[1], a[2], gpus, spread, codes,
                                                         needs)
                                    : 0;
    if (ok != 1)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    Py_ssize_t count = 0;
    SpanWrites w = {a[10] == Py_None ? NULL : a[10], a[15], a[16] == Py_None ? NULL : a[16], gpus, same};
    if (span_refresh_write(a[3], i, codes, needs, &w, todo, &count) < 0)
        return NULL;
    return PyBytes_FromStringAndSize((const char *)todo, 2 * count);
}

/* Why a function: whether two rows of a node differ in anything but free MiB (index, MiB, health): 0 the same; 1
 * they differ or are not exact (the caller refreshes every cell afresh, which is always right). */
static int span_row_differs(PyObject *b, PyObject *n, int64_t *bfree, int64_t *nfree) {
    int64_t bi, bm, ni, nm;
    if (!PyTuple_CheckExact(b) || !PyTuple_CheckExact(n) || PyTuple_GET_SIZE(b) < 7 || PyTuple_GET_SIZE(n) < 7)
        return 1;
    if (!span_int(PyTuple_GET_ITEM(b, 1), &bi) || !span_int(PyTuple_GET_ITEM(n, 1), &ni) || bi != ni
        || !span_int(PyTuple_GET_ITEM(b, 3), &bm) || !span_int(PyTuple_GET_ITEM(n, 3), &nm) || bm != nm)
        return 1;
    PyObject *bh = PyTuple_GET_ITEM(b, 4), *nh = PyTuple_GET_ITEM(n, 4);
    if (!PyBool_Check(bh) || bh != nh)
        return 1;
    return !span_int(PyTuple_GET_ITEM(b, 6), bfree) || !span_int(PyTuple_GET_ITEM(n, 6), nfree);
}

/* span_above(before, now): for two views' rows (each a tuple of GpuRows), None where they differ in anything but
 * free MiB (the row count, a GPU's index, MiB or health; or a value not an exact int below 2^52 or a health not a
 * bool); else the largest free MiB, before or after, of the GPUs whose free MiB changed (-1: none did). Why: a
 * spanning cell whose size is above it keeps its verdict (FitMemo._refresh_groups), and building and comparing the
 * views' columns in Python cost more than the cells' refresh. Rows met as one object are the same. Fast-call: no
 * argument tuple made at every bind. */
static PyObject *nameids_span_above(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "span_above(before, now) takes two tuples");
        return NULL;
    }
    PyObject *before = args[0], *now = args[1];
    if (PyTuple_GET_SIZE(before) != PyTuple_GET_SIZE(now))
        Py_RETURN_NONE;
    int64_t above = -1;
    for (Py_ssize_t p = 0; p < PyTuple_GET_SIZE(now); p++) {
        PyObject *b = PyTuple_GET_ITEM(before, p), *n = PyTuple_GET_ITEM(now, p);
        int64_t bfree, nfree;
        if (b == n)
            continue;
        if (span_row_differs(b, n, &bfree, &nfree))
            Py_RETURN_NONE;
        if (bfree != nfree) {
            int64_t high = bfree > nfree ? bfree : nfree;
            above = high > above ? high : above;
        }
    }
    return PyLong_FromLongLong((long long)above);
}

/* ------------------------------------------------------------------ a bind's spanning groups in one call (issue 34)
 * span_refresh_node is FitMemo._refresh_groups natively, set-up included: the change check (the view against the one
 * the cells were refreshed at: the fields a verdict reads, then span_above on the rows), the node's kept set searches
 * (the memo's _found: made when absent, a chosen list per group), and per group (N, policy) the plan's lookup (kept
 * per topology, as _search_plan keeps it) and span_refresh's work on the same 17 arguments (node_refresh: the view's
 * column and rows decoded once for all groups). Why: the Python around two native calls per bind (the groups' loop,
 * the plan lookup, 17 arguments a call) was a quarter of _refresh_groups (benchmarks/README.md, issue 34, ninth
 * round). What it cannot do goes back to the caller's Python (the reference's pieces): a group whose plan is not
 * kept, whose codes are not exact (None), or whose cells need Python (a reason, a text not made yet, a search left
 * to the reference). The view's fields: */
enum { N_UNIT, N_UNPLACED, N_ERROR, N_ROWS, N_KEYS, N_FREE_ROWS, N_TOPO, N_OVER, N_COMPUTE, N_FIELDS };
static const char *const node_fields[N_FIELDS] = {"unit_mib", "unplaced_mib", "error", "rows", "free_keys",
                                                  "free_rows", "topo", "over", "compute"};

/* Where a view type keeps those fields (its slots), found once per type: the memo has one view type. */
typedef struct {
    PyTypeObject *type; /* a strong reference, or NULL before the first call */
    Py_ssize_t offset[N_FIELDS];
} NodeSlots;
static NodeSlots node_slots;

/* Why: a view's fields read at their slots' offsets with no attribute lookup (fill_offsets' reason), the offsets
 * found at the first call with this type. 0; -1 (TypeError) where a field is not a slot holding an object. */
static int node_offsets(PyTypeObject *type) {
    if (node_slots.type == type)
        return 0;
    Py_ssize_t offset[N_FIELDS];
    for (int j = 0; j < N_FIELDS; j++) {
        PyObject *name = PyUnicode_InternFromString(node_fields[j]);
        if (name == NULL)
            return -1;
        PyObject *descr = _PyType_Lookup(type, name); /* borrowed; no Python code runs */
        Py_DECREF(name);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)
            || ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "span_refresh_node: %s.%s is not a slot holding an object", type->tp_name,
                         node_fields[j]);
            return -1;
        }
        offset[j] = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    Py_XSETREF(node_slots.type, (PyTypeObject *)Py_NewRef((PyObject *)type));
    memcpy(node_slots.offset, offset, sizeof offset);
    return 0;
}

/* Why: one field of a view of the type node_offsets read (borrowed: the view holds it); NULL with an AttributeError
 * where the slot is empty. */
static PyObject *node_field(PyObject *view, int field) {
    PyObject *v = *(PyObject **)(void *)((char *)view + node_slots.offset[field]);
    if (v == NULL)
        PyErr_Format(PyExc_AttributeError, "span_refresh_node: a view without %s", node_fields[field]);
    return v;
}

/* Why a function: one field of the change check, read and judged with strong references held (a value's __bool__ or
 * __eq__, were it not a plain one, could replace a view's slot): unplaced MiB or the error true in either view, else
 * the two views' values unequal. 1 / 0; -1 an error set. */
static int node_differs(PyObject *view, PyObject *before, int field) {
    PyObject *v = node_field(view, field), *b = v != NULL ? node_field(before, field) : NULL;
    if (b == NULL)
        return -1;
    Py_INCREF(v);
    Py_INCREF(b);
    int out;
    if (field == N_UNPLACED || field == N_ERROR) {
        out = PyObject_IsTrue(v);
        if (out == 0)
            out = PyObject_IsTrue(b);
    } else {
        int eq = PyObject_RichCompareBool(b, v, Py_EQ);
        out = eq < 0 ? -1 : !eq;
    }
    Py_DECREF(v);
    Py_DECREF(b);
    return out;
}

/* Why a function: _refresh_groups' change check: `above` and `same` as its Python computes them (every cell
 * afresh, 1 << 62 and False, unless `before` is a view whose unit, topology, limit and compute columns equal the
 * view's, neither with unplaced MiB or an error, and span_above answers for the rows). 0; -1 an error set. */
static int node_above(PyObject *view, PyObject *before, PyObject **above, int *same) {
    static const int fields[] = {N_UNPLACED, N_ERROR, N_UNIT, N_TOPO, N_OVER, N_COMPUTE}; /* the Python's order */
    *same = 0;
    *above = NULL;
    int differ = before == Py_None;
    for (size_t f = 0; f < sizeof fields / sizeof *fields && !differ; f++)
        if ((differ = node_differs(view, before, fields[f])) < 0)
            return -1;
    if (!differ) {
        PyObject *rows[2] = {node_field(before, N_ROWS), node_field(view, N_ROWS)};
        if (rows[0] == NULL || rows[1] == NULL)
            return -1;
        PyObject *changed = nameids_span_above(NULL, rows, 2); /* (exact tuples and ints only: no Python code) */
        if (changed == NULL)
            return -1;
        if (changed != Py_None) {
            *above = changed;
            *same = 1;
            return 0;
        }
        Py_DECREF(changed);
    }
    *above = PyLong_FromLongLong((long long)1 << 62);
    return *above == NULL ? -1 : 0;
}

/* Why a function: the node's kept set searches (founds[i], a dict), made when absent with fitmemo's bound (found_max:
 * all dropped when full), as _refresh_groups and fill_chosen make them. Borrowed (founds holds it); NULL error. */
static PyObject *node_found(PyObject *founds, PyObject *i, Py_ssize_t found_max) {
    PyObject *found = PyDict_GetItemWithError(founds, i);
    if (found != NULL) {
        if (!PyDict_CheckExact(found)) {
            PyErr_SetString(PyExc_TypeError, "span_refresh_node: a node's kept set searches are not a dict");
            return NULL;
        }
        return found;
    }
    if (PyErr_Occurred())
        return NULL;
    if (PyDict_GET_SIZE(founds) >= found_max)
        PyDict_Clear(founds); /* (dicts of lists of tuples of numbers released: no Python code runs) */
    found = PyDict_New();
    if (found == NULL)
        return NULL;
    int bad = PyDict_SetItem(founds, i, found);
    Py_DECREF(found); /* founds holds it */
    return bad < 0 ? NULL : found;
}

/* Why a function: the group's chosen list in `found` (made with len(keys) + 1 Nones when absent, as _refresh_groups
 * makes it). Borrowed (found holds it); NULL with an error set. */
static PyObject *node_chosen(PyObject *found, PyObject *at, Py_ssize_t nkeys) {
    PyObject *chosen = PyDict_GetItemWithError(found, at);
    if (chosen != NULL || PyErr_Occurred())
        return chosen;
    chosen = PyList_New(nkeys + 1);
    if (chosen == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j <= nkeys; j++)
        PyList_SET_ITEM(chosen, j, Py_NewRef(Py_None));
    int bad = PyDict_SetItem(found, at, chosen);
    Py_DECREF(chosen); /* found holds it */
    return bad < 0 ? NULL : chosen;
}

/* What every group of one call shares: the view's fields, the node's texts, above and same, the topology's id, and
 * the view decoded once for all groups (cache: its free column, keys_ok 0 where not exact; its rows for the searches,
 * rows_state as SpanCache's, kept from group to group: the same view's rows). */
typedef struct {
    PyObject *i, *keys, *rows, *free_rows, *topo, *unit, *texts, *above, *topo_id, *found;
    PyObject *names, *host_json; /* the memo's (node_text: a text missing made here) */
    Py_ssize_t id;
    int same, keys_ok, rows_state;
    SpanCache *cache;
} NodeCall;

/* Why apart: whether a node name is written in JSON as its own bytes (encode_basestring_ascii leaves it as it is:
 * printable ASCII without a quote or a backslash, as every valid node name is). */
static int node_plain(PyObject *name, const char **p, size_t *len) {
    if ((*p = ascii_name(name, len)) == NULL || *len > 4096)
        return 0;
    for (size_t k = 0; k < *len; k++) {
        unsigned char c = (unsigned char)(*p)[k];
        if (c < 0x20 || c > 0x7e || c == '"' || c == '\\')
            return 0;
    }
    return 1;
}

/* Why apart: `{"Host":"<name>","Score":<score>}` as a new str (score 0..SPAN_MAX_SCORE): wire.host_priority_json's
 * bytes for a plain name. */
static PyObject *node_text_new(const char *name, size_t len, unsigned char score) {
    static const char head[] = "{\"Host\":\"", mid[] = "\",\"Score\":";
    char digits[3];
    size_t d = (size_t)(put_score(digits, score) - digits), size = sizeof head - 1 + len + sizeof mid - 1 + d + 1;
    PyObject *text = PyUnicode_New((Py_ssize_t)size, 127);
    if (text == NULL)
        return NULL;
    char *o = (char *)PyUnicode_DATA(text);
    memcpy(o, head, sizeof head - 1);
    o += sizeof head - 1;
    memcpy(o, name, len);
    o += len;
    memcpy(o, mid, sizeof mid - 1);
    o += sizeof mid - 1;
    memcpy(o, digits, d);
    o[d] = '}';
    return text;
}

/* Why: a fitting cell whose score moves to one the node has no text for went back to Python (FitMemo._fragment: the
 * text made, a new tuple of the node's texts), ~10 % of the refresh at 0 % (benchmarks/README.md, issue 34, ninth
 * round). Here the text is made as _fragment makes it and kept where it keeps it: host_json[id] becomes a new tuple
 * of SPAN_MAX_SCORE + 1 (the old one's, or Nones), this score's text set; n->texts follows. Left to Python (0): a
 * name that is not plain or not a str, an id beyond names or host_json, host_json[id] of another shape, a text that
 * is there. 1 made; -1 an error set (memory). Only a tuple of strs and None is released: no Python code runs. */
static int node_text(NodeCall *n, unsigned char score) {
    if (n->names == NULL || score > SPAN_MAX_SCORE || n->id >= PyList_GET_SIZE(n->host_json)
        || n->id >= PyList_GET_SIZE(n->names))
        return 0;
    PyObject *old = PyList_GET_ITEM(n->host_json, n->id);
    if (old != Py_None && (!PyTuple_CheckExact(old) || PyTuple_GET_SIZE(old) != SPAN_MAX_SCORE + 1
                           || PyTuple_GET_ITEM(old, score) != Py_None))
        return 0;
    const char *p;
    size_t len;
    if (!node_plain(PyList_GET_ITEM(n->names, n->id), &p, &len))
        return 0;
    PyObject *made = node_text_new(p, len, score), *texts = made ? PyTuple_New(SPAN_MAX_SCORE + 1) : NULL;
    if (texts == NULL) {
        Py_XDECREF(made);
        return -1;
    }
    for (Py_ssize_t k = 0; k <= SPAN_MAX_SCORE; k++)
        PyTuple_SET_ITEM(texts, k, k == score ? made : Py_NewRef(old == Py_None ? Py_None : PyTuple_GET_ITEM(old, k)));
    PyList_SET_ITEM(n->host_json, n->id, texts);
    n->texts = texts;
    Py_DECREF(old);
    return 1;
}

/* Why a function: before the writes, the texts that the cells which fitted and fit with another score lack are
 * made (node_text), so span_refresh_write writes those cells here rather than handing them to Python. 0; -1 error. */
static int node_texts(NodeCall *n, PyObject *cells, Py_ssize_t i, const unsigned char *codes) {
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(cells); j++) {
        PyObject *cell = PyTuple_GET_ITEM(cells, j);
        unsigned char code = codes[j];
        if (code > SPAN_MAX_SCORE || (unsigned char)PyByteArray_AS_STRING(PyTuple_GET_ITEM(cell, 1))[i] != SPAN_KIND_FITS
            || (unsigned char)PyByteArray_AS_STRING(PyTuple_GET_ITEM(cell, 2))[i] == code)
            continue;
        if (node_text(n, code) < 0)
            return -1;
    }
    return 0;
}

/* Why its own: span_refresh_codes on the shared cache (the column decoded once per call, not per group): every held
 * cell's code before any is written. 1; 0 None (a value not exact: the group's Python); -1 error. */
static int node_codes(SpanCache *c, PyObject *cells, Py_ssize_t i, int64_t unit, int64_t above, PyObject *chosen,
                      long gpus, int spread, unsigned char *codes, int64_t *needs) {
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(cells); j++) {
        PyObject *cell = PyTuple_GET_ITEM(cells, j);
        int64_t need;
        codes[j] = SPAN_KEEP;
        if ((unsigned char)PyByteArray_AS_STRING(PyTuple_GET_ITEM(cell, 1))[i] == SPAN_KIND_NONE)
            continue;
        if (!span_need(PyTuple_GET_ITEM(cell, 0), unit, &need))
            return 0;
        if (need > above)
            continue;
        needs[j] = need;
        int ok = span_cache_code(c, chosen, need, gpus, spread, &codes[j]);
        if (ok != 1)
            return ok;
    }
    return 1;
}

/* Why its own: nameids_span_refresh's body for one group of the node (its 17 arguments checked by span_refresh_args,
 * the same codes and writes), the view's column and rows read from the call's shared cache rather than per group:
 * the same answer. A new reference: bytes of (position, code) pairs, or None; NULL with an error set. */
static PyObject *node_refresh(NodeCall *n, PyObject *const *a) {
    Py_ssize_t i;
    long gpus;
    int64_t above, unit;
    if (span_refresh_args(a, 17, &i, &gpus, &above) < 0)
        return NULL;
    SpanCache *c = n->cache;
    c->rows = a[6] == Py_None ? NULL : a[6];
    c->free_rows = a[7];
    c->by_mask = c->rows == NULL ? NULL : a[8];
    c->closes = a[9];
    c->levels = a[14] == Py_None ? NULL : a[14];
    c->used = 0; /* (the chosen sets decoded are this group's: N differs) */
    c->rows_state = c->by_mask == NULL ? -1 : n->rows_state;
    unsigned char codes[SPAN_MAX_CELLS], todo[2 * SPAN_MAX_CELLS];
    int64_t needs[SPAN_MAX_CELLS];
    int ok = n->keys_ok && span_int(a[13], &unit)
                 ? node_codes(c, a[3], i, unit, above, a[2], gpus, a[5] == Py_True, codes, needs)
                 : 0;
    if (c->by_mask != NULL)
        n->rows_state = c->rows_state; /* read (or found unreadable) once for the groups after */
    if (ok != 1)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    if (node_texts(n, a[3], i, codes) < 0) /* (n->texts: a tuple of SPAN_MAX_SCORE + 1 where it made one) */
        return NULL;
    Py_ssize_t count = 0;
    SpanWrites w = {n->texts == Py_None ? NULL : n->texts, a[15], a[16] == Py_None ? NULL : a[16], gpus,
                    a[12] == Py_True};
    if (span_refresh_write(a[3], i, codes, needs, &w, todo, &count) < 0)
        return NULL;
    return PyBytes_FromStringAndSize((const char *)todo, 2 * count);
}

/* Why a function: one group (at, members, cells, spread, plans, no_room) of _refresh_groups' loop: its chosen list,
 * its plan (plans[id(topo)] holding topo itself; absent: the caller's Python makes it) and span_refresh's work on
 * the arguments the Python passes it (node_refresh). *todo: a new reference to what span_refresh would answer, or
 * Py_False (no plan kept). 0; -1 an error set. */
static int node_group(NodeCall *n, PyObject *group, PyObject **todo) {
    if (!PyTuple_CheckExact(group) || PyTuple_GET_SIZE(group) != 6 || !PyTuple_CheckExact(PyTuple_GET_ITEM(group, 0))
        || PyTuple_GET_SIZE(PyTuple_GET_ITEM(group, 0)) != 2 || !PyDict_CheckExact(PyTuple_GET_ITEM(group, 4))) {
        PyErr_SetString(PyExc_TypeError, "span_refresh_node: a group is not ((N, policy), members, cells, spread, "
                        "plans: dict, no_room)");
        return -1;
    }
    PyObject *at = PyTuple_GET_ITEM(group, 0);
    if (!PyLong_CheckExact(PyTuple_GET_ITEM(at, 0)) || !PyUnicode_CheckExact(PyTuple_GET_ITEM(at, 1))) {
        PyErr_SetString(PyExc_TypeError, "span_refresh_node: a group's (N, policy) is not (int, str)");
        return -1;
    }
    PyObject *chosen = node_chosen(n->found, at, PyTuple_GET_SIZE(n->keys));
    if (chosen == NULL)
        return -1;
    PyObject *plan = PyDict_GetItemWithError(PyTuple_GET_ITEM(group, 4), n->topo_id); /* an int key: no Python code */
    if (plan == NULL && PyErr_Occurred())
        return -1;
    if (plan == NULL || !PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 4 || PyTuple_GET_ITEM(plan, 0) != n->topo) {
        *todo = Py_NewRef(Py_False);
        return 0;
    }
    PyObject *by_mask = PyTuple_GET_ITEM(plan, 1);
    PyObject *args[17] = {n->i, n->keys, chosen, PyTuple_GET_ITEM(group, 2), PyTuple_GET_ITEM(at, 0),
                          PyTuple_GET_ITEM(group, 3), by_mask == Py_None ? Py_None : n->rows, n->free_rows, by_mask,
                          PyTuple_GET_ITEM(plan, 2), n->texts, n->above, n->same ? Py_True : Py_False, n->unit,
                          PyTuple_GET_ITEM(plan, 3), n->rows, PyTuple_GET_ITEM(group, 5)};
    *todo = node_refresh(n, args);
    return *todo == NULL ? -1 : 0;
}

/* Why a function: span_refresh_node's arguments checked (types, the node id within host_json, the view's type's
 * slots), so the rest reads them without checks. 0; -1 an error set naming the bad one. */
static int node_args(PyObject *const *a, Py_ssize_t nargs, Py_ssize_t *found_max) {
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "span_refresh_node takes 8 arguments (%zd given)", nargs);
        return -1;
    }
    if (!PyLong_CheckExact(a[0]) || !PyList_CheckExact(a[3]) || !PyDict_CheckExact(a[4]) || !PyLong_CheckExact(a[5])
        || !PyList_CheckExact(a[6]) || !PyList_CheckExact(a[7])) {
        PyErr_SetString(PyExc_TypeError, "span_refresh_node: i must be an int, groups a list, founds a dict, "
                        "found_max an int, host_json and names lists");
        return -1;
    }
    Py_ssize_t i = PyLong_AsSsize_t(a[0]);
    *found_max = PyLong_AsSsize_t(a[5]);
    if (PyErr_Occurred())
        return -1;
    if (i < 0 || i >= PyList_GET_SIZE(a[6]) || *found_max < 1) {
        PyErr_Format(PyExc_ValueError, "span_refresh_node: node id %zd outside host_json (%zd) or found_max %zd below 1",
                     i, PyList_GET_SIZE(a[6]), *found_max);
        return -1;
    }
    PyObject *texts = PyList_GET_ITEM(a[6], i);
    if (texts != Py_None && !PyTuple_CheckExact(texts)) {
        PyErr_SetString(PyExc_TypeError, "span_refresh_node: a node's texts are not a tuple or None");
        return -1;
    }
    if (node_offsets(Py_TYPE(a[1])) < 0)
        return -1;
    if (a[2] != Py_None && Py_TYPE(a[2]) != Py_TYPE(a[1])) {
        PyErr_SetString(PyExc_TypeError, "span_refresh_node: before is not None or a view of the view's type");
        return -1;
    }
    return 0;
}

/* Why a function: the groups' loop: each group's span_refresh (node_group), and those it leaves to Python listed as
 * (position in groups, what is left: bytes of (position, code) pairs, None (span_refresh answered None: the
 * reference refreshes the group) or False (no plan kept)); every group listed with None where the view takes the
 * general path (unplaced MiB, an error, no rows: every code GENERAL). *left: a new list, or NULL with none left.
 * 0; -1 an error set. */
static int node_groups(NodeCall *n, PyObject *groups, int general, PyObject **left) {
    *left = NULL;
    for (Py_ssize_t g = 0; g < PyList_GET_SIZE(groups); g++) {
        PyObject *todo = Py_None;
        if (!general && node_group(n, PyList_GET_ITEM(groups, g), &todo) < 0) {
            Py_XDECREF(*left);
            return -1;
        }
        if (general)
            Py_INCREF(todo);
        if (PyBytes_CheckExact(todo) && PyBytes_GET_SIZE(todo) == 0) {
            Py_DECREF(todo);
            continue;
        }
        PyObject *pos = PyLong_FromSsize_t(g), *item = pos == NULL ? NULL : PyTuple_Pack(2, pos, todo);
        Py_XDECREF(pos);
        Py_DECREF(todo);
        if (item == NULL || (*left == NULL && (*left = PyList_New(0)) == NULL) || PyList_Append(*left, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(*left);
            return -1;
        }
        Py_DECREF(item);
    }
    return 0;
}

/* span_refresh_node(i, view, before, groups, founds, found_max, host_json, names): FitMemo._refresh_groups for node
 * id i and its new view natively, past the limit cap's check: `before` the view its cells were refreshed at (or
 * None), groups the refresh plan's (Group), founds the memo's _found (the node's entry made here when absent, bounded
 * by found_max), host_json and names the memo's texts per node and names (a text missing made and kept there as
 * FitMemo._fragment would: node_text). Answers None where every group was refreshed here; else (above,
 * same, the node's found dict, [(position in groups, bytes | None | False), ...]) for the caller's Python (see
 * node_groups). Bounded as span_refresh (per group) and by the groups' list; runs no Python code for the memo's own
 * values (exact ints, strs, tuples). Fast-call: it runs at every bind. */
static PyObject *nameids_span_refresh_node(PyObject *module, PyObject *const *a, Py_ssize_t nargs) {
    (void)module;
    Py_ssize_t found_max;
    int general = 0;
    if (node_args(a, nargs, &found_max) < 0)
        return NULL;
    NodeCall n = {.i = a[0]};
    if (node_above(a[1], a[2], &n.above, &n.same) < 0)
        return NULL;
    PyObject *out = NULL, *left = NULL, *v[N_FIELDS];
    static const int truths[] = {N_UNPLACED, N_ERROR, N_ROWS}; /* unplaced MiB, an error or no rows: GENERAL */
    for (size_t t = 0; t < sizeof truths / sizeof *truths && !general; t++) {
        PyObject *f = node_field(a[1], truths[t]);
        if (f == NULL)
            goto done;
        Py_INCREF(f); /* (held while judged: see node_differs) */
        general = PyObject_IsTrue(f);
        Py_DECREF(f);
        if (general < 0)
            goto done;
        general = truths[t] == N_ROWS ? !general : general;
    }
    for (int j = 0; j < N_FIELDS; j++) /* read after every truth and == (no Python code runs from here on) */
        if ((v[j] = node_field(a[1], j)) == NULL)
            goto done;
    Py_ssize_t i = PyLong_AsSsize_t(a[0]); /* (checked by node_args; host_json's length again, after those) */
    if (i >= PyList_GET_SIZE(a[6]) || (!general && (!PyTuple_CheckExact(v[N_KEYS]) || !PyTuple_CheckExact(v[N_ROWS])))) {
        PyErr_SetString(PyExc_TypeError, "span_refresh_node: the view's free_keys and rows must be tuples, host_json "
                        "hold the node id");
        goto done;
    }
    n.keys = v[N_KEYS], n.rows = v[N_ROWS], n.free_rows = v[N_FREE_ROWS], n.topo = v[N_TOPO], n.unit = v[N_UNIT];
    n.texts = PyList_GET_ITEM(a[6], i);
    n.host_json = a[6], n.names = a[7], n.id = i;
    if ((n.found = node_found(a[4], a[0], found_max)) == NULL)
        goto done;
    Py_INCREF(n.found); /* held: the answer hands it on */
    SpanCache cache;
    cache.by_mask = NULL;
    n.cache = &cache;
    n.keys_ok = !general && span_cache_keys(&cache, n.keys); /* (checked a tuple above) */
    n.rows_state = 0;
    n.topo_id = general ? NULL : PyLong_FromVoidPtr(n.topo);
    if ((general || n.topo_id != NULL) && node_groups(&n, a[3], general, &left) == 0)
        out = left == NULL ? Py_NewRef(Py_None) : PyTuple_Pack(4, n.above, n.same ? Py_True : Py_False, n.found, left);
    Py_XDECREF(n.topo_id);
    Py_DECREF(n.found);
    Py_XDECREF(left);
done:
    Py_DECREF(n.above);
    return out;
}

/* The refresh's entries, added to the module at init (add_span_refresh): kept apart from module_methods so that
 * this section stays one block. */
static PyMethodDef span_refresh_methods[] = {
    {"span_refresh", (PyCFunction)(void (*)(void))nameids_span_refresh, METH_FASTCALL,
     "span_refresh(i, keys, chosen, cells, gpus, spread, rows, free_rows, by_mask, closes, texts, above, same, "
     "unit, levels, view_rows, no_room): one spanning group's cells of node i refreshed natively; the (position, "
     "code) pairs left to Python, or None"},
    {"span_above", (PyCFunction)(void (*)(void))nameids_span_above, METH_FASTCALL,
     "span_above(before, now): the largest free MiB of the GPUs whose free MiB changed (-1: none); None where the "
     "rows differ otherwise"},
    {"span_refresh_node", (PyCFunction)(void (*)(void))nameids_span_refresh_node, METH_FASTCALL,
     "span_refresh_node(i, view, before, groups, founds, found_max, host_json, names): a bind's spanning groups of "
     "node i "
     "refreshed natively; None, or (above, same, found, [(group position, bytes | None | False)]) left to Python"},
    {NULL, NULL, 0, NULL},
};

/* Why: module init adds these (one call) without the shared method table changing. */
static int add_span_refresh(PyObject *m) {
    return PyModule_AddFunctions(m, span_refresh_methods);
}
