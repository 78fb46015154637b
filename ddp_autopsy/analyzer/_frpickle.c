/* Flight Recorder pickles straight to columns (ddp_autopsy.analyzer._frpickle).
 *
 * parse(data) runs the pickle opcodes a Flight Recorder dump uses (protocols 2-5 as Python's
 * pickler and torch::jit::Pickler write them: dicts, lists, tuples, strings, ints, floats,
 * booleans, None, the memo) on nodes of its own instead of Python objects, then returns the
 * entries as columns: Python objects only for the values the analysis reads.
 *
 * It is strict: anything else (another opcode, a class, a huge memo index, a bytes object, an
 * int beyond 64 bits, a container where a scalar is expected, nesting, too much work) makes it
 * return None, and the caller reads the dump with Python's unpickler as before. It never runs
 * code, never imports, and bounds its work by the size of the input.
 *
 * Returns None, a message when the file is certainly damaged in a way Python's unpickler
 * handles badly (a memo index beyond the file: it allocates up to it), or
 * (top, n, scalars, structured):
 *   top         the top-level dict as Python objects, "entries" mapped to []
 *   n           the number of entries (all dicts, at least one)
 *   scalars     14 columns (FIELDS[0:14]): None for a key no entry has; (v,) when every
 *               value is v; a Column for an Int64 field of ints (times: None read as 0,
 *               which means "not yet" as None does), for a Boolean or String field of
 *               bools or strings (and None); else a list of n values
 *   structured  7 pairs (firsts, change): runs of equal neighbours of (pg_id, process_group)
 *               and of FIELDS[15:21] (see flight_recorder._runs)
 *
 * Reader(paths, threads, ahead) does the same for many files: its threads read them and run
 * the opcodes (phase A: no Python object, no GIL, strings checked as UTF-8 and compared as
 * bytes) ahead of the caller, whose take(i) makes the Python objects (phase B).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __APPLE__
#define st_mtim st_mtimespec
#endif

enum { K_NONE, K_TRUE, K_FALSE, K_INT, K_FLOAT, K_STR, K_LIST, K_TUPLE, K_DICT };

typedef struct {
    uint8_t kind;
    uint8_t checked; /* shapes it was found to have */
    int8_t keyfield; /* the field it names as a key (-1: none, -2: not looked up yet) */
    uint32_t len;    /* containers: slots used (a dict: 2 per pair) */
    uint32_t cap;    /* containers: slots allocated at u.off */
    union {
        int64_t i;
        double f;
        uint64_t off; /* containers: offset in kids */
    } u;
    PyObject *obj; /* its Python object once made (strings: at parse) */
} Node;

typedef struct {
    const uint8_t *d;
    Py_ssize_t n, pos;
    Node *nodes;
    uint32_t nn, ncap;
    uint32_t *kids;
    uint64_t nk, kcap;
    uint32_t *stack;
    uint32_t sp, scap;
    uint32_t *marks;
    uint32_t mp, mcap;
    uint32_t *memo;
    uint32_t memocap, memocount;
    int used_put, used_memoize;
    int64_t budget; /* comparisons and checks left */
    uint64_t bad_memo; /* a memo index no pickler writes in a file this size (0: none) */
} P;

#define UNSET UINT32_MAX
#define C_SURR 16 /* Node.checked of a string holding surrogates (polars cannot hold it) */
#define NONE_NODE 0
#define TRUE_NODE 1
#define FALSE_NODE 2
#define SMALL_INT 3 /* nodes 3..258: the ints 0..255 */
#define BAIL (-1)

static int grow(void **arr, uint64_t *cap, uint64_t need, size_t size) {
    if (need <= *cap) return 0;
    uint64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    if (c > ((uint64_t)1 << 34) / size) return BAIL;
    void *p = realloc(*arr, c * size);
    if (!p) return BAIL;
    *arr = p;
    *cap = c;
    return 0;
}

static int grow32(void **arr, uint32_t *cap, uint64_t need, size_t size) {
    uint64_t c = *cap;
    if (need >= UNSET - 1) return BAIL;
    int r = grow(arr, &c, need, size);
    if (r) return r;
    *cap = (uint32_t)c;
    return 0;
}

/* Beyond this many nodes (a 20,000-entry dump has ~400,000) Python's unpickler reads it. */
#define MAX_NODES (8u << 20)

static int64_t grow_nodes(P *p) {
    uint32_t c = p->ncap ? p->ncap * 2 : 1024;
    if (c > MAX_NODES) return BAIL;
    Node *a = realloc(p->nodes, (size_t)c * sizeof(Node));
    if (!a) return BAIL;
    p->nodes = a;
    p->ncap = c;
    return 0;
}

static inline int64_t new_node(P *p, uint8_t kind) {
    if (p->nn == p->ncap && grow_nodes(p)) return BAIL;
    Node *nd = &p->nodes[p->nn];
    nd->kind = kind;
    nd->checked = 0;
    nd->keyfield = -2;
    nd->len = nd->cap = 0;
    nd->u.off = 0;
    nd->obj = NULL;
    return p->nn++;
}

static int push(P *p, uint32_t v) {
    if (grow32((void **)&p->stack, &p->scap, (uint64_t)p->sp + 1, 4)) return BAIL;
    p->stack[p->sp++] = v;
    return 0;
}

static uint32_t fence(P *p) { return p->mp ? p->marks[p->mp - 1] : 0; }

static int add_kids(P *p, uint32_t c, const uint32_t *items, uint32_t count) {
    Node *nd = &p->nodes[c];
    if ((uint64_t)nd->len + count >= UNSET / 2) return BAIL;
    if (nd->len + count > nd->cap) {
        uint64_t cap = (uint64_t)nd->cap * 2;
        if (cap < (uint64_t)nd->len + count) cap = (uint64_t)nd->len + count;
        if (grow((void **)&p->kids, &p->kcap, p->nk + cap, 4)) return BAIL;
        nd = &p->nodes[c];
        memcpy(p->kids + p->nk, p->kids + nd->u.off, (size_t)nd->len * 4);
        nd->u.off = p->nk;
        nd->cap = (uint32_t)cap;
        p->nk += cap;
    }
    uint32_t *to = p->kids + nd->u.off + nd->len;
    for (uint32_t j = 0; j < count; j++) to[j] = items[j]; /* mostly 1-44 items: no call */
    nd->len += count;
    return 0;
}

/* dict keys Python can hash without running code: the others make its unpickler fail */
static int keys_ok(P *p, const uint32_t *items, uint32_t count) {
    for (uint32_t j = 0; j < count; j += 2) {
        uint8_t k = p->nodes[items[j]].kind;
        if (k == K_LIST || k == K_TUPLE || k == K_DICT) return 0;
    }
    return 1;
}

static int container_from(P *p, uint8_t kind, uint32_t from) {
    /* a new container of stack[from:], which is popped, then pushed */
    int64_t c = new_node(p, kind);
    if (c < 0) return BAIL;
    if (kind == K_DICT && !keys_ok(p, p->stack + from, p->sp - from)) return BAIL;
    if (p->sp > from && add_kids(p, (uint32_t)c, p->stack + from, p->sp - from)) return BAIL;
    p->sp = from;
    return push(p, (uint32_t)c);
}

static int memo_put(P *p, uint64_t idx) {
    if (p->sp <= fence(p)) return BAIL;
    if (idx > (uint64_t)p->n + 16) { /* more than the file has opcodes: damaged */
        if (idx >= (1u << 20)) p->bad_memo = idx; /* and costly for Python's unpickler */
        return BAIL;
    }
    if (idx >= p->memocap) {
        uint32_t old = p->memocap;
        if (grow32((void **)&p->memo, &p->memocap, idx + 1, 4)) return BAIL;
        memset(p->memo + old, 0xff, (size_t)(p->memocap - old) * 4);
    }
    if (p->memo[idx] == UNSET) p->memocount++;
    p->memo[idx] = p->stack[p->sp - 1];
    return 0;
}

static int64_t le_int(const uint8_t *s, int k) {
    uint64_t v = 0;
    for (int j = k - 1; j >= 0; j--) v = (v << 8) | s[j];
    if (k > 0 && k < 8 && (s[k - 1] & 0x80)) v |= ~(uint64_t)0 << (8 * k);
    return (int64_t)v;
}

/* Whether data[0:n) decodes as Python's UTF-8 decoder decodes it with "surrogatepass" (strict
 * UTF-8, and surrogates written as three bytes): checked without Python objects, so that the
 * opcode loop can run without the GIL. 0: not; 1: yes; 2: yes, with surrogates. */
static int utf8_ok(const uint8_t *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    int surr = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int k;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) k = 1;
        else if (c == 0xe0) k = 2, lo = 0xa0;
        else if (c == 0xed) k = 2, surr |= s[i + 1 < n ? i + 1 : i] >= 0xa0; /* they pass */
        else if (c >= 0xe1 && c <= 0xef) k = 2;
        else if (c == 0xf0) k = 3, lo = 0x90;
        else if (c >= 0xf1 && c <= 0xf3) k = 3;
        else if (c == 0xf4) k = 3, hi = 0x8f;
        else return 0;
        if (n - i <= k) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int j = 2; j <= k; j++)
            if ((s[i + j] & 0xc0) != 0x80) return 0;
        i += k + 1;
    }
    return 1 + surr; /* 2: valid, with surrogates */
}

/* a string node of data[pos:pos+len] (its Python object is made when needed: conv) */
static int64_t str_node(P *p, Py_ssize_t pos, Py_ssize_t len) {
    int ok = len < UNSET ? utf8_ok(p->d + pos, len) : 0;
    if (!ok) return BAIL;
    int64_t c = new_node(p, K_STR);
    if (c < 0) return BAIL;
    if (ok == 2) p->nodes[c].checked = C_SURR;
    p->nodes[c].u.i = pos;
    p->nodes[c].len = (uint32_t)len;
    return c;
}

/* whether a string node's bytes are the ASCII text t */
static int str_is(P *p, uint32_t i, const char *t) {
    Node *nd = &p->nodes[i];
    size_t k = strlen(t);
    return nd->kind == K_STR && nd->len == k && memcmp(p->d + nd->u.i, t, k) == 0;
}

static int64_t int_node_only(P *p, int64_t v) {
    int64_t c = new_node(p, K_INT);
    if (c >= 0) p->nodes[c].u.i = v;
    return c;
}

static int64_t int_node(P *p, int64_t v) {
    int64_t c = new_node(p, K_INT);
    if (c >= 0) p->nodes[c].u.i = v;
    return c;
}

/* The hot state lives in locals (stores through the stack would otherwise make the compiler
 * reload every field of P): SYNC before a helper that reads P, LOAD after. */
#define SYNC() (p->sp = sp, p->pos = pos)
#define LOAD() (sp = p->sp, stack = p->stack)
#define NEED(k)                                                 \
    do {                                                        \
        if ((uint64_t)(k) > (uint64_t)(end - pos)) return BAIL; \
    } while (0)
#define PUSH(v)                                                             \
    do {                                                                    \
        uint32_t v_ = (uint32_t)(v);                                        \
        if (sp == p->scap) {                                                \
            SYNC();                                                         \
            if (grow32((void **)&p->stack, &p->scap, (uint64_t)sp + 1, 4)) \
                return BAIL;                                                \
            stack = p->stack;                                               \
        }                                                                   \
        stack[sp++] = v_;                                                   \
    } while (0)
#define PUSH_NEW(expr)             \
    do {                           \
        SYNC();                    \
        int64_t c_ = (expr);       \
        if (c_ < 0) return BAIL;   \
        PUSH(c_);                  \
    } while (0)
#define FENCE (p->mp ? p->marks[p->mp - 1] : 0)

/* Runs the opcodes; the result node or BAIL. */
static int64_t run(P *p) {
    const uint8_t *d = p->d;
    const Py_ssize_t end = p->n;
    Py_ssize_t pos = 0;
    uint32_t *stack = p->stack;
    uint32_t sp = 0;
    uint32_t *memo = p->memo, memocap = p->memocap;
    for (;;) {
        NEED(1);
        uint8_t op = d[pos++];
        switch (op) {
        case 'h': /* BINGET */
        case 'j': { /* LONG_BINGET */
            uint64_t idx;
            if (op == 'h') {
                NEED(1);
                idx = d[pos++];
            } else {
                NEED(4);
                idx = (uint32_t)le_int(d + pos, 4);
                pos += 4;
            }
            if (idx >= memocap || memo[idx] == UNSET) return BAIL;
            PUSH(memo[idx]);
            break;
        }
        case 'q': /* BINPUT */
        case 'r': /* LONG_BINPUT */
        case 0x94: { /* MEMOIZE */
            uint64_t idx;
            if (op == 'q') {
                NEED(1);
                idx = d[pos++];
            } else if (op == 'r') {
                NEED(4);
                idx = (uint32_t)le_int(d + pos, 4);
                pos += 4;
            } else {
                idx = p->memocount;
            }
            /* mixed, MEMOIZE's index would depend on how Python counts: left to Python */
            if (op == 0x94 ? p->used_put : p->used_memoize) return BAIL;
            if (op == 0x94) p->used_memoize = 1; else p->used_put = 1;
            SYNC();
            if (memo_put(p, idx)) return BAIL;
            memo = p->memo;
            memocap = p->memocap;
            break;
        }
        case 0x80: /* PROTO */
            NEED(1);
            if (d[pos++] > 5) return BAIL;
            break;
        case 0x95: { /* FRAME */
            NEED(8);
            uint64_t len = (uint64_t)le_int(d + pos, 8);
            pos += 8;
            NEED(len);
            break;
        }
        case '.': /* STOP */
            if (sp <= FENCE) return BAIL;
            SYNC();
            return stack[sp - 1];
        case '(': /* MARK */
            if (grow32((void **)&p->marks, &p->mcap, (uint64_t)p->mp + 1, 4)) return BAIL;
            p->marks[p->mp++] = sp;
            break;
        case '}':
            PUSH_NEW(new_node(p, K_DICT));
            break;
        case ']':
            PUSH_NEW(new_node(p, K_LIST));
            break;
        case ')':
            PUSH_NEW(new_node(p, K_TUPLE));
            break;
        case 'N':
            PUSH(NONE_NODE);
            break;
        case 0x88:
            PUSH(TRUE_NODE);
            break;
        case 0x89:
            PUSH(FALSE_NODE);
            break;
        case 'K': /* small ints share their nodes (ints are immutable) */
            NEED(1);
            PUSH(SMALL_INT + d[pos]);
            pos += 1;
            break;
        case 'M':
            NEED(2);
            PUSH_NEW(int_node(p, d[pos] | (d[pos + 1] << 8)));
            pos += 2;
            break;
        case 'J':
            NEED(4);
            PUSH_NEW(int_node(p, le_int(d + pos, 4)));
            pos += 4;
            break;
        case 0x8a: { /* LONG1 */
            NEED(1);
            int k = d[pos++];
            if (k > 8) return BAIL; /* beyond 64 bits */
            NEED(k);
            PUSH_NEW(int_node(p, k ? le_int(d + pos, k) : 0));
            pos += k;
            break;
        }
        case 'G': { /* BINFLOAT, big-endian */
            NEED(8);
            uint64_t bits = 0;
            for (int j = 0; j < 8; j++) bits = (bits << 8) | d[pos + j];
            pos += 8;
            SYNC();
            int64_t c = new_node(p, K_FLOAT);
            if (c < 0) return BAIL;
            memcpy(&p->nodes[c].u.f, &bits, 8);
            PUSH(c);
            break;
        }
        case 'X': /* BINUNICODE */
        case 0x8c: /* SHORT_BINUNICODE */
        case 0x8d: { /* BINUNICODE8 */
            int w = op == 'X' ? 4 : op == 0x8c ? 1 : 8;
            NEED(w);
            uint64_t len = w == 4 ? (uint32_t)le_int(d + pos, 4)
                                  : w == 1 ? d[pos] : (uint64_t)le_int(d + pos, 8);
            pos += w;
            NEED(len);
            PUSH_NEW(str_node(p, pos, (Py_ssize_t)len));
            pos += (Py_ssize_t)len;
            break;
        }
        case 'a': { /* APPEND */
            if (sp < FENCE + 2) return BAIL;
            uint32_t v = stack[--sp];
            uint32_t c = stack[sp - 1];
            if (p->nodes[c].kind != K_LIST || add_kids(p, c, &v, 1)) return BAIL;
            break;
        }
        case 's': { /* SETITEM */
            if (sp < FENCE + 3) return BAIL;
            uint32_t kv[2] = {stack[sp - 2], stack[sp - 1]};
            sp -= 2;
            uint32_t c = stack[sp - 1];
            if (p->nodes[c].kind != K_DICT || !keys_ok(p, kv, 2) || add_kids(p, c, kv, 2))
                return BAIL;
            break;
        }
        case 'e': /* APPENDS */
        case 'u': { /* SETITEMS */
            if (!p->mp) return BAIL;
            uint32_t k = p->marks[--p->mp];
            if (k == 0 || k > sp || k - 1 < FENCE) return BAIL;
            uint32_t c = stack[k - 1];
            uint32_t count = sp - k;
            if (op == 'e' ? p->nodes[c].kind != K_LIST
                          : (p->nodes[c].kind != K_DICT || count % 2 ||
                             !keys_ok(p, stack + k, count)))
                return BAIL;
            if (count && add_kids(p, c, stack + k, count)) return BAIL;
            sp = k;
            break;
        }
        case 't': /* TUPLE */
        case 'l': /* LIST */
        case 'd': { /* DICT */
            if (!p->mp) return BAIL;
            uint32_t k = p->marks[--p->mp];
            if (k > sp || (op == 'd' && (sp - k) % 2)) return BAIL;
            SYNC();
            if (container_from(p, op == 't' ? K_TUPLE : op == 'l' ? K_LIST : K_DICT, k))
                return BAIL;
            LOAD();
            break;
        }
        case 0x85:
        case 0x86:
        case 0x87: { /* TUPLE1..3 */
            uint32_t m = op - 0x84;
            if (sp < FENCE + m) return BAIL;
            SYNC();
            if (container_from(p, K_TUPLE, sp - m)) return BAIL;
            LOAD();
            break;
        }
        default:
            return BAIL;
        }
    }
}

/* ------------------------------------------------------------------ Python objects */

static PyObject *BAILED; /* a sentinel: the dump is left to the Python reader */

static PyObject *conv(P *p, uint32_t i, int depth) {
    if (p->nodes[i].obj) {
        Py_INCREF(p->nodes[i].obj);
        return p->nodes[i].obj;
    }
    Node *nd = &p->nodes[i];
    PyObject *o = NULL;
    switch (nd->kind) {
    case K_NONE:
        Py_RETURN_NONE;
    case K_TRUE:
        Py_RETURN_TRUE;
    case K_FALSE:
        Py_RETURN_FALSE;
    case K_INT:
        o = PyLong_FromLongLong(nd->u.i);
        break;
    case K_FLOAT:
        o = PyFloat_FromDouble(nd->u.f);
        break;
    case K_STR: /* checked by utf8_ok: fails only for memory */
        o = PyUnicode_DecodeUTF8((const char *)p->d + nd->u.i, nd->len, "surrogatepass");
        if (!o) {
            PyErr_Clear();
            Py_INCREF(BAILED);
            return BAILED;
        }
        break;
    case K_LIST:
    case K_TUPLE:
    case K_DICT: {
        if (depth > 48 || --p->budget < 0) {
            Py_INCREF(BAILED); /* nested too deeply, or in a cycle */
            return BAILED;
        }
        uint32_t len = nd->len;
        uint64_t off = nd->u.off;
        uint8_t kind = nd->kind;
        o = kind == K_LIST ? PyList_New(len) : kind == K_TUPLE ? PyTuple_New(len) : PyDict_New();
        if (!o) return NULL;
        for (uint32_t j = 0; j < len; j++) {
            PyObject *v = conv(p, p->kids[off + j], depth + 1);
            if (v == BAILED || !v) {
                Py_DECREF(o);
                return v;
            }
            if (kind == K_LIST) {
                PyList_SET_ITEM(o, j, v);
            } else if (kind == K_TUPLE) {
                PyTuple_SET_ITEM(o, j, v);
            } else {
                PyObject *val = conv(p, p->kids[off + ++j], depth + 1);
                if (val == BAILED || !val) {
                    Py_DECREF(v);
                    Py_DECREF(o);
                    return val;
                }
                int r = PyDict_SetItem(o, v, val);
                Py_DECREF(v);
                Py_DECREF(val);
                if (r < 0) { /* an unhashable key: Python's unpickler fails there */
                    PyErr_Clear();
                    Py_DECREF(o);
                    Py_INCREF(BAILED);
                    return BAILED;
                }
            }
        }
        break;
    }
    default:
        Py_INCREF(BAILED);
        return BAILED;
    }
    if (!o) return NULL;
    Py_INCREF(o);
    p->nodes[i].obj = o; /* shared nodes stay shared objects, as unpickled */
    return o;
}

/* ------------------------------------------------------------------ shapes and equality */

/* Shapes a structured field's values must have (else the dump is left to Python). Scalars
 * are None, str and int only, so that equality here is Python's. */
enum { C_FLAT = 1, C_SIZES = 2, C_FRAMES = 4, C_DICT = 8 };
#define MAX_ITEMS 4096
#define MAX_PAIRS 64

static int is_scalar(P *p, uint32_t i) {
    uint8_t k = p->nodes[i].kind;
    return k == K_NONE || k == K_STR || k == K_INT;
}

typedef int (*shape_fn)(P *, uint32_t);

/* a scalar, or a list or tuple of at most `max` items of shape `item` */
static int seq_of(P *p, uint32_t i, uint32_t max, shape_fn item, uint8_t bit) {
    if (is_scalar(p, i) || (p->nodes[i].checked & bit)) return 1;
    Node *nd = &p->nodes[i];
    if ((nd->kind != K_LIST && nd->kind != K_TUPLE) || nd->len > max) return 0;
    p->budget -= nd->len;
    if (p->budget < 0) return 0;
    for (uint32_t j = 0; j < nd->len; j++)
        if (!item(p, p->kids[nd->u.off + j])) return 0;
    p->nodes[i].checked |= bit;
    return 1;
}

static int flat(P *p, uint32_t i) { return seq_of(p, i, MAX_ITEMS, is_scalar, C_FLAT); }
static int sizes(P *p, uint32_t i) { return seq_of(p, i, MAX_ITEMS, flat, C_SIZES); }

/* a scalar, or a dict of at most MAX_PAIRS scalar keys and values (a stack frame) */
static int frame(P *p, uint32_t i) {
    if (is_scalar(p, i) || (p->nodes[i].checked & C_DICT)) return 1;
    Node *nd = &p->nodes[i];
    if (nd->kind != K_DICT || nd->len > 2 * MAX_PAIRS) return 0;
    for (uint32_t j = 0; j < nd->len; j++)
        if (!is_scalar(p, p->kids[nd->u.off + j])) return 0;
    p->nodes[i].checked |= C_DICT;
    return 1;
}

static int frames(P *p, uint32_t i) { return seq_of(p, i, MAX_ITEMS, frame, C_FRAMES); }

static int eq(P *p, uint32_t a, uint32_t b);

/* dict equality as Python's: same keys (the last of duplicates counts), equal values */
static int dict_lookup(P *p, Node *d, uint32_t key, uint32_t *val) {
    int found = 0;
    for (uint32_t j = 0; j < d->len; j += 2)
        if (eq(p, p->kids[d->u.off + j], key)) {
            *val = p->kids[d->u.off + j + 1];
            found = 1;
        }
    return found;
}

static uint32_t distinct_keys(P *p, Node *d) {
    uint32_t count = 0;
    for (uint32_t j = 0; j < d->len; j += 2) {
        int later = 0;
        for (uint32_t l = j + 2; l < d->len && !later; l += 2)
            later = eq(p, p->kids[d->u.off + j], p->kids[d->u.off + l]);
        count += !later;
    }
    return count;
}

static int eq(P *p, uint32_t a, uint32_t b) {
    if (a == b) return 1;
    p->budget--;
    Node *x = &p->nodes[a], *y = &p->nodes[b];
    if (x->kind != y->kind) return 0;
    switch (x->kind) {
    case K_NONE:
        return 1;
    case K_INT:
        return x->u.i == y->u.i;
    case K_STR: /* UTF-8 is one spelling per text: equal bytes, equal strings */
        return x->len == y->len && memcmp(p->d + x->u.i, p->d + y->u.i, x->len) == 0;
    case K_LIST:
    case K_TUPLE:
        if (x->len != y->len) return 0;
        for (uint32_t j = 0; j < x->len; j++) {
            uint32_t ka = p->kids[x->u.off + j], kb = p->kids[y->u.off + j];
            if (ka != kb && !eq(p, ka, kb)) return 0;
        }
        return 1;
    case K_DICT: {
        if (distinct_keys(p, x) != distinct_keys(p, y)) return 0;
        for (uint32_t j = 0; j < x->len; j += 2) {
            uint32_t va = NONE_NODE, vb = NONE_NODE;
            dict_lookup(p, x, p->kids[x->u.off + j], &va);
            if (!dict_lookup(p, y, p->kids[x->u.off + j], &vb) || !eq(p, va, vb)) return 0;
        }
        return 1;
    }
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------ columns for polars */

/* A column handed to polars without a Python object per value, through the Arrow PyCapsule
 * interface (__arrow_c_array__): int64 ('l'), bool ('b') or UTF-8 text ('U', 64-bit offsets),
 * with None as null ('b', 'U'). */
struct ArrowSchema {
    const char *format, *name, *metadata;
    int64_t flags, n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};
struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

typedef struct {
    char fmt;       /* 'l', 'b' or 'U' */
    Py_ssize_t n;
    int64_t *data;  /* 'l': the values; 'U': n + 1 offsets into chars */
    uint8_t *bytes; /* 'b': a byte per value (0, 1) */
    uint8_t *valid; /* 'b', 'U': a byte per value, 0 for null (NULL: none is) */
    char *chars;    /* 'U': the text */
} Col;

static void col_free(Col *c) {
    free(c->data);
    free(c->bytes);
    free(c->valid);
    free(c->chars);
    memset(c, 0, sizeof(*c));
}

typedef struct {
    PyObject_HEAD
    Col c;
} Column;

static PyTypeObject ColumnType;

/* a Column owning c's buffers (c is emptied) */
static PyObject *column_adopt(Col *c) {
    Column *o = PyObject_New(Column, &ColumnType);
    if (!o) return NULL;
    o->c = *c;
    memset(c, 0, sizeof(*c));
    return (PyObject *)o;
}

static void column_dealloc(Column *o) {
    col_free(&o->c);
    PyObject_Free(o);
}

static Py_ssize_t column_len(Column *o) { return o->c.n; }

static void schema_release(struct ArrowSchema *s) { s->release = NULL; }

typedef struct {
    void *buf[3];
    const void *ptrs[3];
} Owned;

static void array_release(struct ArrowArray *a) {
    Owned *o = a->private_data;
    for (int j = 0; j < 3; j++) free(o->buf[j]);
    free(o);
    a->release = NULL;
}

static void schema_capsule_free(PyObject *cap) {
    struct ArrowSchema *s = PyCapsule_GetPointer(cap, "arrow_schema");
    if (!s) {
        PyErr_Clear();
        return;
    }
    if (s->release) s->release(s);
    free(s);
}

static void array_capsule_free(PyObject *cap) {
    struct ArrowArray *a = PyCapsule_GetPointer(cap, "arrow_array");
    if (!a) {
        PyErr_Clear();
        return;
    }
    if (a->release) a->release(a);
    free(a);
}

/* a copy of n bytes (at least one byte allocated) */
static void *copy_of(const void *src, size_t n) {
    void *p = malloc(n ? n : 1);
    if (p && n) memcpy(p, src, n);
    return p;
}

/* a bitmap of n one-byte flags (Arrow's validity and bool values) */
static uint8_t *bits(const uint8_t *flags, Py_ssize_t n, int64_t *zeros) {
    uint8_t *b = calloc((size_t)(n / 8 + 1), 1);
    if (!b) return NULL;
    int64_t z = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (flags[i]) b[i >> 3] |= (uint8_t)(1u << (i & 7));
        else z++;
    }
    if (zeros) *zeros = z;
    return b;
}

static PyObject *column_arrow(Column *self, PyObject *args, PyObject *kwargs) {
    (void)args;
    (void)kwargs; /* requested_schema: there is only one */
    Col *c = &self->c;
    struct ArrowSchema *schema = calloc(1, sizeof(*schema));
    struct ArrowArray *array = calloc(1, sizeof(*array));
    Owned *own = calloc(1, sizeof(*own));
    int64_t nulls = 0;
    int ok = schema && array && own;
    if (ok && c->valid) ok = (own->buf[0] = bits(c->valid, c->n, &nulls)) != NULL;
    if (ok && c->fmt == 'l') ok = (own->buf[1] = copy_of(c->data, (size_t)c->n * 8)) != NULL;
    if (ok && c->fmt == 'b') ok = (own->buf[1] = bits(c->bytes, c->n, NULL)) != NULL;
    if (ok && c->fmt == 'U')
        ok = (own->buf[1] = copy_of(c->data, (size_t)(c->n + 1) * 8)) != NULL &&
             (own->buf[2] = copy_of(c->chars, (size_t)c->data[c->n])) != NULL;
    if (!ok) {
        if (own)
            for (int j = 0; j < 3; j++) free(own->buf[j]);
        free(own);
        free(schema);
        free(array);
        return PyErr_NoMemory();
    }
    for (int j = 0; j < 3; j++) own->ptrs[j] = own->buf[j];
    schema->format = c->fmt == 'l' ? "l" : c->fmt == 'b' ? "b" : "U";
    schema->name = "";
    schema->flags = 2; /* nullable */
    schema->release = schema_release;
    array->length = c->n;
    array->null_count = nulls;
    array->n_buffers = c->fmt == 'U' ? 3 : 2;
    array->buffers = own->ptrs;
    array->private_data = own;
    array->release = array_release;
    PyObject *s = PyCapsule_New(schema, "arrow_schema", schema_capsule_free);
    if (!s) {
        free(schema);
        array_release(array);
        free(array);
        return NULL;
    }
    PyObject *a = PyCapsule_New(array, "arrow_array", array_capsule_free);
    if (!a) {
        Py_DECREF(s);
        array_release(array);
        free(array);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(2, s, a);
    Py_DECREF(s);
    Py_DECREF(a);
    return out;
}

static PyMethodDef column_methods[] = {
    {"__arrow_c_array__", (PyCFunction)(void (*)(void))column_arrow, METH_VARARGS | METH_KEYWORDS,
     "The values as an Arrow array (schema and array capsules)."},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods column_seq = {.sq_length = (lenfunc)column_len};

static PyTypeObject ColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ddp_autopsy.analyzer._frpickle.Column",
    .tp_basicsize = sizeof(Column),
    .tp_dealloc = (destructor)column_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A column of int64, bool or text (one dump's values, or a batch's): "
              "pl.Series(name, it).",
    .tp_methods = column_methods,
    .tp_as_sequence = &column_seq,
};

/* join(columns): one Column of the given ones (of one kind), in order */
static PyObject *join(PyObject *self, PyObject *arg) {
    (void)self;
    PyObject *seq = PySequence_Fast(arg, "join() takes a sequence of Columns");
    if (!seq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq), n = 0;
    int64_t nchars = 0;
    int any_valid = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t j = 0; j < k; j++) {
        if (Py_TYPE(items[j]) != &ColumnType ||
            ((Column *)items[j])->c.fmt != ((Column *)items[0])->c.fmt) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "join() takes a sequence of Columns of one kind");
            return NULL;
        }
        Col *c = &((Column *)items[j])->c;
        n += c->n;
        any_valid |= c->valid != NULL;
        if (c->fmt == 'U') nchars += c->data[c->n];
    }
    char fmt = k ? ((Column *)items[0])->c.fmt : 'l';
    Col out = {.fmt = fmt, .n = n};
    int ok = 1;
    if (fmt == 'l') ok = (out.data = malloc((size_t)(n ? n : 1) * 8)) != NULL;
    if (fmt == 'b') ok = (out.bytes = malloc((size_t)(n ? n : 1))) != NULL;
    if (fmt == 'U')
        ok = (out.data = malloc((size_t)(n + 1) * 8)) != NULL &&
             (out.chars = malloc((size_t)(nchars ? nchars : 1))) != NULL;
    if (ok && any_valid) ok = (out.valid = malloc((size_t)(n ? n : 1))) != NULL;
    if (!ok) {
        col_free(&out);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    Py_ssize_t at = 0;
    int64_t base = 0;
    if (fmt == 'U') out.data[0] = 0;
    for (Py_ssize_t j = 0; j < k; j++) {
        Col *c = &((Column *)items[j])->c;
        if (fmt == 'l') memcpy(out.data + at, c->data, (size_t)c->n * 8);
        if (fmt == 'b') memcpy(out.bytes + at, c->bytes, (size_t)c->n);
        if (fmt == 'U') {
            for (Py_ssize_t i = 1; i <= c->n; i++) out.data[at + i] = base + c->data[i];
            memcpy(out.chars + base, c->chars, (size_t)c->data[c->n]);
            base += c->data[c->n];
        }
        if (any_valid) {
            if (c->valid) memcpy(out.valid + at, c->valid, (size_t)c->n);
            else memset(out.valid + at, 1, (size_t)c->n);
        }
        at += c->n;
    }
    Py_DECREF(seq);
    return column_adopt(&out);
}

/* ------------------------------------------------------------------ entries to columns */

static const char *FIELDS[] = {
    /* scalars: one value per entry */
    "record_id", "pg_id", "collective_seq_id", "p2p_seq_id", "op_id", "is_p2p", "state",
    "retired", "time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns",
    "duration_ms", "timeout_ms", "thread_name",
    /* structured: runs of equal neighbours */
    "process_group", "profiling_name", "input_sizes", "input_dtypes", "output_sizes",
    "output_dtypes", "frames"};
#define NF 21
#define NSCALAR 14
#define F_PG_ID 1
/* Int64 fields (polars dtype), and the times among them, where None and 0 both mean "not yet" */
static const uint8_t INT_FIELD[NSCALAR] = {1, 1, 1, 1, 1, 0, 0, 0, 2, 2, 2, 0, 1, 0};
/* Boolean (1) and String (2) fields */
static const uint8_t TYPED_FIELD[NSCALAR] = {0, 0, 0, 0, 0, 1, 2, 1, 0, 0, 0, 0, 0, 2};
#define F_PG 14
static const shape_fn SHAPE[NF] = {[14] = flat,  [15] = is_scalar, [16] = sizes, [17] = flat,
                                   [18] = sizes, [19] = flat,      [20] = frames};

static int field_of(P *p, uint32_t key) {
    for (int f = 0; f < NF; f++)
        if (str_is(p, key, FIELDS[f])) return f;
    return -1;
}

/* ------------------------------------------------------------------ phase A: no Python objects
 *
 * Reading a dump is two phases. Phase A (prepare) runs the opcodes, checks the shapes, finds the
 * runs and the Int64 columns: it calls nothing of Python, so it runs without the GIL, on another
 * thread (Reader). Phase B (build) makes the Python objects the caller gets, with the GIL. */

enum { S_ABSENT, S_CONST, S_COL, S_LIST };

typedef struct {
    uint32_t top, n;
    uint32_t *vals;                /* n x NF value nodes (NONE_NODE where a key is absent) */
    uint8_t scalar[NSCALAR];       /* S_*: how each scalar field is returned */
    Col cols[NSCALAR];             /* S_COL: its values */
    uint8_t *change[NF - NSCALAR]; /* structured: 1 where a run starts */
    uint32_t count[NF - NSCALAR];  /* structured: how many runs */
} Prep;

static void prep_free(Prep *c) {
    free(c->vals);
    for (int f = 0; f < NSCALAR; f++) col_free(&c->cols[f]);
    for (int f = 0; f < NF - NSCALAR; f++) free(c->change[f]);
    memset(c, 0, sizeof(*c));
}

/* Where the runs of equal neighbours of values[0..n) (pairs when v2) start; BAIL when out of
 * memory or budget. */
static int find_runs(P *p, const uint32_t *v, const uint32_t *v2, uint32_t n, int stride,
                     uint8_t **out, uint32_t *runs) {
    uint8_t *change = malloc(n ? n : 1);
    if (!change) return BAIL;
    uint32_t count = 1;
    change[0] = 1;
    for (uint32_t i = 1; i < n; i++) {
        const uint32_t *a = v + (size_t)i * stride, *b = v + (size_t)(i - 1) * stride;
        int same = (*a == *b || eq(p, *a, *b)) &&
                   (!v2 || eq(p, v2[(size_t)i * stride], v2[(size_t)(i - 1) * stride]));
        change[i] = !same;
        count += !same;
        if (p->budget < 0) {
            free(change);
            return BAIL;
        }
    }
    *out = change;
    *runs = count;
    return 0;
}

/* An Int64 field: S_CONST when every value is the same, S_COL (values in *out) when all are
 * ints (or None, for a time: read as 0, "not yet" as None is), else S_LIST; BAIL without
 * memory. */
static int int_kind(P *p, const uint32_t *v, uint32_t n, int stride, int time, Col *out) {
    int same = 1;
    for (uint32_t e = 0; e < n; e++) {
        Node *nd = &p->nodes[v[(size_t)e * stride]];
        if (!(nd->kind == K_INT || (time && nd->kind == K_NONE))) return S_LIST;
        if (e && same) {
            Node *first = &p->nodes[v[0]];
            same = nd->kind == first->kind && (nd->kind == K_NONE || nd->u.i == first->u.i);
        }
    }
    if (same) return S_CONST;
    int64_t *col = malloc((size_t)(n ? n : 1) * 8);
    if (!col) return BAIL;
    for (uint32_t e = 0; e < n; e++) {
        Node *nd = &p->nodes[v[(size_t)e * stride]];
        col[e] = nd->kind == K_INT ? nd->u.i : 0;
    }
    out->fmt = 'l';
    out->n = n;
    out->data = col;
    return S_COL;
}

/* A Boolean or String field: S_CONST when every value is the same, S_COL when all are bools
 * (text: strings polars can hold, no lone surrogates) or None, else S_LIST (Python types them,
 * as before); BAIL without memory. Equal here is equal in Python. */
static int typed_kind(P *p, const uint32_t *v, uint32_t n, int stride, int text, Col *out) {
    int same = 1, nulls = 0;
    int64_t chars = 0;
    Node *first = &p->nodes[v[0]];
    for (uint32_t e = 0; e < n; e++) {
        Node *nd = &p->nodes[v[(size_t)e * stride]];
        if (nd->kind == K_NONE) nulls = 1;
        else if (text ? nd->kind != K_STR || (nd->checked & C_SURR)
                      : nd->kind != K_TRUE && nd->kind != K_FALSE)
            return S_LIST;
        if (text && nd->kind == K_STR) chars += nd->len;
        if (e && same)
            same = nd->kind == first->kind &&
                   (nd->kind != K_STR || (nd->len == first->len &&
                                          !memcmp(p->d + nd->u.i, p->d + first->u.i, nd->len)));
    }
    if (same) return S_CONST;
    out->fmt = text ? 'U' : 'b';
    out->n = n;
    if (nulls && !(out->valid = malloc(n))) return BAIL;
    if (text ? !(out->data = malloc((size_t)(n + 1) * 8)) || !(out->chars = malloc(chars + 1))
             : !(out->bytes = malloc(n)))
        return BAIL;
    int64_t at = 0;
    if (text) out->data[0] = 0;
    for (uint32_t e = 0; e < n; e++) {
        Node *nd = &p->nodes[v[(size_t)e * stride]];
        if (nulls) out->valid[e] = nd->kind != K_NONE;
        if (!text) {
            out->bytes[e] = nd->kind == K_TRUE;
            continue;
        }
        if (nd->kind == K_STR) {
            memcpy(out->chars + at, p->d + nd->u.i, nd->len);
            at += nd->len;
        }
        out->data[e + 1] = at;
    }
    return S_COL;
}

/* The entries' values by field, checked, with their runs: 0, or BAIL (left to Python). */
static int prepare(P *p, uint32_t top, uint32_t entries, Prep *c) {
    Node *el = &p->nodes[entries];
    uint32_t n = el->len;
    c->top = top;
    c->n = n;
    uint32_t *vals = c->vals = malloc((size_t)n * NF * 4 + 4);
    if (!vals) return BAIL;
    for (size_t j = 0; j < (size_t)n * NF; j++) vals[j] = NONE_NODE;
    int has[NF] = {0};
    for (uint32_t e = 0; e < n; e++) {
        Node *d = &p->nodes[p->kids[el->u.off + e]];
        if (d->kind != K_DICT) return BAIL;
        p->budget -= d->len;
        for (uint32_t j = 0; j < d->len; j += 2) {
            uint32_t key = p->kids[d->u.off + j];
            int f = p->nodes[key].keyfield; /* keys are memoised: each is looked up once */
            if (f == -2) f = p->nodes[key].keyfield = (int8_t)field_of(p, key);
            if (f < 0) continue;
            vals[(size_t)e * NF + f] = p->kids[d->u.off + j + 1]; /* the last of duplicates */
            has[f] = 1;
        }
    }
    if (p->budget < 0) return BAIL;
    for (int f = NSCALAR; f < NF; f++)
        for (uint32_t e = 0; e < n; e++)
            if (!SHAPE[f](p, vals[(size_t)e * NF + f])) return BAIL;
    for (uint32_t e = 0; e < n; e++) /* pg_id takes part in the group runs */
        if (!is_scalar(p, vals[(size_t)e * NF + F_PG_ID])) return BAIL;
    for (int f = 0; f < NSCALAR; f++) {
        int k = !has[f]         ? S_ABSENT
                : INT_FIELD[f]   ? int_kind(p, vals + f, n, NF, INT_FIELD[f] == 2, &c->cols[f])
                : TYPED_FIELD[f] ? typed_kind(p, vals + f, n, NF, TYPED_FIELD[f] == 2, &c->cols[f])
                                 : S_LIST;
        if (k == BAIL) return BAIL;
        c->scalar[f] = (uint8_t)k;
    }
    for (int f = NSCALAR; f < NF; f++)
        if (find_runs(p, vals + (f == F_PG ? F_PG_ID : f), f == F_PG ? vals + F_PG : NULL, n, NF,
                      &c->change[f - NSCALAR], &c->count[f - NSCALAR]))
            return BAIL;
    return 0;
}

static int p_init(P *p, const uint8_t *d, Py_ssize_t n) {
    memset(p, 0, sizeof(*p));
    p->d = d;
    p->n = n;
    p->budget = 64 * (int64_t)n + 1000000;
    /* sized for a usual dump (a node per ~15 bytes, a slot per ~10): few reallocs */
    uint64_t want = (uint64_t)n / 12 + 1024;
    if (want < MAX_NODES && (p->nodes = malloc(want * sizeof(Node)))) p->ncap = (uint32_t)want;
    if (grow((void **)&p->kids, &p->kcap, (uint64_t)n / 8 + 1024, 4)) return BAIL;
    /* the singletons None, True, False, then the ints 0..255 */
    if (new_node(p, K_NONE) < 0 || new_node(p, K_TRUE) < 0 || new_node(p, K_FALSE) < 0)
        return BAIL;
    for (int v = 0; v < 256; v++)
        if (int_node_only(p, v) < 0) return BAIL;
    return 0;
}

/* frees a P; with the GIL once phase B made objects (before it, no node holds one) */
static void release(P *p) {
    if (p->nodes)
        for (uint32_t i = 0; i < p->nn; i++) Py_XDECREF(p->nodes[i].obj);
    free(p->nodes);
    free(p->kids);
    free(p->stack);
    free(p->marks);
    free(p->memo);
    memset(p, 0, sizeof(*p));
}

enum { A_NONE, A_OK, A_MEMO };

/* Phase A of data[0:n): A_OK (c prepared), A_MEMO (p->bad_memo) or A_NONE. */
static int phase_a(P *p, const uint8_t *d, Py_ssize_t n, Prep *c) {
    memset(c, 0, sizeof(*c));
    if (p_init(p, d, n)) return A_NONE;
    int64_t top = run(p);
    if (p->bad_memo) return A_MEMO;
    if (top < 0 || p->nodes[top].kind != K_DICT) return A_NONE;
    Node *t = &p->nodes[top];
    int64_t entries = -1;
    for (uint32_t j = 0; j < t->len; j += 2)
        if (str_is(p, p->kids[t->u.off + j], "entries")) entries = p->kids[t->u.off + j + 1];
    if (entries < 0 || p->nodes[entries].kind != K_LIST || p->nodes[entries].len == 0)
        return A_NONE;
    return prepare(p, (uint32_t)top, (uint32_t)entries, c) ? A_NONE : A_OK;
}

/* ------------------------------------------------------------------ phase B: Python objects */

/* one structured field's (firsts, change) */
static PyObject *runs_of(P *p, Prep *c, int f) {
    uint32_t n = c->n, count = c->count[f - NSCALAR];
    const uint8_t *change = c->change[f - NSCALAR];
    const uint32_t *v = c->vals + (f == F_PG ? F_PG_ID : f);
    const uint32_t *v2 = f == F_PG ? c->vals + F_PG : NULL;
    PyObject *firsts = PyList_New(count), *ch = NULL, *out = NULL;
    if (!firsts) return NULL;
    for (uint32_t i = 0, r = 0; i < n; i++) {
        if (!change[i]) continue;
        PyObject *o = conv(p, v[(size_t)i * NF], 0);
        if (o && o != BAILED && v2) {
            PyObject *o2 = conv(p, v2[(size_t)i * NF], 0);
            if (!o2 || o2 == BAILED) {
                Py_DECREF(o);
                o = o2;
            } else {
                PyObject *t = PyTuple_Pack(2, o, o2);
                Py_DECREF(o);
                Py_DECREF(o2);
                o = t;
            }
        }
        if (!o || o == BAILED) {
            Py_DECREF(firsts);
            return o;
        }
        PyList_SET_ITEM(firsts, r++, o);
    }
    if (count == 1 || count == n) {
        ch = count == 1 ? Py_None : Py_True;
        Py_INCREF(ch);
    } else {
        ch = PyList_New(n);
        if (!ch) {
            Py_DECREF(firsts);
            return NULL;
        }
        for (uint32_t i = 0; i < n; i++) {
            PyObject *b = change[i] ? Py_True : Py_False;
            Py_INCREF(b);
            PyList_SET_ITEM(ch, i, b);
        }
    }
    out = PyTuple_Pack(2, firsts, ch);
    Py_DECREF(firsts);
    Py_DECREF(ch);
    return out;
}

/* (top, n, scalars, structured) from a prepared dump; None when left to Python; NULL on error */
static PyObject *build(P *p, Prep *c) {
    uint32_t n = c->n;
    const uint32_t *vals = c->vals;
    PyObject *result = NULL, *topdict = NULL, *scalars = NULL, *structured = NULL;
    scalars = PyTuple_New(NSCALAR);
    if (!scalars) goto fail;
    for (int f = 0; f < NSCALAR; f++) {
        PyObject *col = NULL;
        if (c->scalar[f] == S_ABSENT) {
            col = Py_None;
            Py_INCREF(col);
        } else if (c->scalar[f] == S_CONST) {
            PyObject *o = conv(p, vals[f], 0);
            if (!o || o == BAILED) {
                if (!o) goto fail;
                Py_DECREF(o);
                goto bail;
            }
            col = PyTuple_Pack(1, o);
            Py_DECREF(o);
            if (!col) goto fail;
        } else if (c->scalar[f] == S_COL) {
            col = column_adopt(&c->cols[f]); /* which owns its buffers now */
            if (!col) goto fail;
        } else {
            col = PyList_New(n);
            if (!col) goto fail;
            for (uint32_t e = 0; e < n; e++) {
                PyObject *o = conv(p, vals[(size_t)e * NF + f], 0);
                if (!o || o == BAILED) {
                    Py_DECREF(col);
                    if (!o) goto fail;
                    Py_DECREF(o);
                    goto bail;
                }
                PyList_SET_ITEM(col, e, o);
            }
        }
        PyTuple_SET_ITEM(scalars, f, col);
    }
    structured = PyTuple_New(NF - NSCALAR);
    if (!structured) goto fail;
    for (int f = NSCALAR; f < NF; f++) {
        PyObject *r = runs_of(p, c, f);
        if (!r) goto fail;
        if (r == BAILED) {
            Py_DECREF(r);
            goto bail;
        }
        PyTuple_SET_ITEM(structured, f - NSCALAR, r);
    }
    /* the top-level dict, its entries left out */
    Node *t = &p->nodes[c->top];
    topdict = PyDict_New();
    if (!topdict) goto fail;
    for (uint32_t j = 0; j < t->len; j += 2) {
        uint32_t k = p->kids[t->u.off + j], v = p->kids[t->u.off + j + 1];
        PyObject *ko = conv(p, k, 1);
        if (!ko || ko == BAILED) {
            if (!ko) goto fail;
            Py_DECREF(ko);
            goto bail;
        }
        PyObject *vo = str_is(p, k, "entries") ? PyList_New(0) : conv(p, v, 1);
        if (!vo || vo == BAILED) {
            Py_DECREF(ko);
            if (!vo) goto fail;
            Py_DECREF(vo);
            goto bail;
        }
        int r = PyDict_SetItem(topdict, ko, vo);
        Py_DECREF(ko);
        Py_DECREF(vo);
        if (r < 0) {
            PyErr_Clear();
            goto bail;
        }
    }
    result = Py_BuildValue("(OIOO)", topdict, n, scalars, structured);
    goto fail; /* frees what is not returned */
bail:
    result = Py_None;
    Py_INCREF(result);
fail:
    Py_XDECREF(topdict);
    Py_XDECREF(scalars);
    Py_XDECREF(structured);
    return result;
}

/* Phase B: what parse() returns for a phase A outcome; frees p and c. */
static PyObject *phase_b(P *p, Prep *c, int a) {
    PyObject *out;
    if (a == A_MEMO)
        /* Python's unpickler would allocate 16 bytes per index up to it (and can bring in the
         * OOM killer before a MemoryError): refused here */
        out = PyUnicode_FromFormat("unreadable pickle (memo index %llu in a %zd-byte file); the "
                                   "dump is damaged", (unsigned long long)p->bad_memo, p->n);
    else if (a == A_OK)
        out = build(p, c);
    else {
        out = Py_None;
        Py_INCREF(out);
    }
    release(p);
    prep_free(c);
    return out;
}

static PyObject *parse(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    P p;
    Prep c;
    int a = phase_a(&p, buf.buf, buf.len, &c);
    PyObject *out = phase_b(&p, &c, a);
    PyBuffer_Release(&buf);
    return out;
}

/* ------------------------------------------------------------------ Reader: phase A on threads
 *
 * Reader(paths, threads, ahead) reads files and runs phase A on `threads` threads of its own
 * (no GIL, no Python), at most `ahead` dumps beyond the one taken last; take(i), in order, waits
 * for dump i (doing it itself when no thread has started it, and the next ones while a thread
 * is on it) and runs phase B. */

/* Files beyond this (flight_recorder.NATIVE_MAX_BYTES) are read by Python. */
#define READER_MAX_BYTES ((Py_ssize_t)64 << 20)

enum { R_FREE, R_BUSY, R_DONE };             /* slot states */
enum { R_SKIP, R_REFUSED, R_PARSED, R_MEMO }; /* outcomes */

typedef struct {
    char *path;
    int state, outcome;
    uint8_t *data;
    Py_ssize_t size;
    double mtime;
    P p;
    Prep c;
} Slot;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t cv;
    Slot *slots;
    Py_ssize_t n, next, taken, ahead;
    int stop, nthreads, started, taking;
    pthread_t threads[4];
} Reader;

/* The file at s->path read whole (R_SKIP when it cannot be, or is not a regular file of at most
 * READER_MAX_BYTES: Python reads it and says why), then phase A when it is a pickle. */
static void slot_work(Slot *s) {
    s->outcome = R_SKIP;
    if (!s->path) return;
    int fd = open(s->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size > READER_MAX_BYTES) {
        close(fd);
        return;
    }
    Py_ssize_t cap = (Py_ssize_t)st.st_size + 1, got = 0; /* one more byte: did it grow? */
    uint8_t *buf = malloc((size_t)cap);
    if (!buf) {
        close(fd);
        return;
    }
    for (;;) {
        ssize_t r = read(fd, buf + got, (size_t)(cap - got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            free(buf);
            close(fd);
            return;
        }
        if (r == 0) break;
        got += r;
        if (got == cap) { /* it grew while read: Python reads it */
            free(buf);
            close(fd);
            return;
        }
    }
    close(fd);
    s->data = buf;
    s->size = got;
    /* as os.stat_result.st_mtime is computed */
    s->mtime = st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9;
    s->outcome = R_REFUSED;
    if (got < 2 || buf[0] != 0x80 || buf[1] < 2 || buf[1] > 5) return; /* not a pickle */
    int a = phase_a(&s->p, buf, got, &s->c);
    if (a == A_NONE) { /* no node holds a Python object yet: freed without the GIL */
        release(&s->p);
        prep_free(&s->c);
        return;
    }
    s->outcome = a == A_OK ? R_PARSED : R_MEMO;
}

static void *reader_thread(void *arg) {
    Reader *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        while (r->next < r->n && r->slots[r->next].state != R_FREE) r->next++;
        if (r->next >= r->n) break;
        if (r->next >= r->taken + r->ahead) {
            pthread_cond_wait(&r->cv, &r->mu);
            continue;
        }
        Slot *s = &r->slots[r->next++];
        s->state = R_BUSY;
        pthread_mutex_unlock(&r->mu);
        slot_work(s);
        pthread_mutex_lock(&r->mu);
        s->state = R_DONE;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void reader_stop(Reader *r) {
    if (!r->slots) return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    for (int t = 0; t < r->started; t++) pthread_join(r->threads[t], NULL);
    r->started = 0;
}

static void slot_free(Slot *s) {
    release(&s->p);
    prep_free(&s->c);
    free(s->data);
    s->data = NULL;
}

static void reader_dealloc(Reader *r) {
    if (r->slots) {
        Py_BEGIN_ALLOW_THREADS
        reader_stop(r);
        Py_END_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < r->n; i++) {
            slot_free(&r->slots[i]);
            free(r->slots[i].path);
        }
        free(r->slots);
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
    }
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static int reader_init(Reader *r, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"paths", "threads", "ahead", NULL};
    PyObject *paths;
    int threads = 1;
    Py_ssize_t ahead = 8;
    if (r->slots) {
        PyErr_SetString(PyExc_RuntimeError, "Reader already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|in", kw, &paths, &threads, &ahead))
        return -1;
    if (threads < 0 || threads > 4 || ahead < 1) {
        PyErr_SetString(PyExc_ValueError, "threads: 0 to 4; ahead: 1 or more");
        return -1;
    }
    PyObject *seq = PySequence_Fast(paths, "paths: a sequence of bytes");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Slot *slots = calloc((size_t)(n ? n : 1), sizeof(Slot));
    if (!slots) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        char *s;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(seq, i), &s, &len) < 0) {
            for (Py_ssize_t j = 0; j < i; j++) free(slots[j].path);
            free(slots);
            Py_DECREF(seq);
            return -1;
        }
        if ((Py_ssize_t)strlen(s) == len) /* else (a NUL inside) Python reads it: R_SKIP */
            slots[i].path = strdup(s);
    }
    Py_DECREF(seq);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->slots = slots;
    r->n = n;
    r->ahead = ahead;
    r->nthreads = threads;
    for (int t = 0; t < threads && n > 1; t++) {
        if (pthread_create(&r->threads[t], NULL, reader_thread, r)) break; /* fewer: slower */
        r->started++;
    }
    return 0;
}

/* take(i) -> (kind, value, size, mtime): "parsed" and parse()'s result (never None), "memo"
 * and its message, "data" and the file's bytes (not a pickle the native reader reads: for
 * Python's readers), or "skip" and None (Python reads the file and says why it cannot). Dumps
 * are taken in order, each once. */
static PyObject *reader_take(Reader *r, PyObject *arg) {
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (!r->slots || i != r->taken || i >= r->n || r->taking) {
        PyErr_SetString(PyExc_IndexError, "take() takes each dump once, in order");
        return NULL;
    }
    r->taking = 1; /* another Python thread cannot take it while the GIL is released */
    Slot *s = &r->slots[i];
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&r->mu);
    if (s->state == R_FREE) { /* no thread has it: do it here */
        s->state = R_BUSY;
        pthread_mutex_unlock(&r->mu);
        slot_work(s);
        pthread_mutex_lock(&r->mu);
        s->state = R_DONE;
    }
    while (s->state != R_DONE) {
        /* a thread has it: rather than wait, parse the next dump no thread has started */
        Py_ssize_t j = r->next > i + 1 ? r->next : i + 1;
        while (j < r->n && j < i + r->ahead && r->slots[j].state != R_FREE) j++;
        if (j < r->n && j < i + r->ahead) {
            r->slots[j].state = R_BUSY;
            pthread_mutex_unlock(&r->mu);
            slot_work(&r->slots[j]);
            pthread_mutex_lock(&r->mu);
            r->slots[j].state = R_DONE;
            pthread_cond_broadcast(&r->cv);
            continue;
        }
        pthread_cond_wait(&r->cv, &r->mu);
    }
    r->taken = i + 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    Py_END_ALLOW_THREADS
    r->taking = 0;
    PyObject *value = NULL;
    const char *kind = "skip";
    if (s->outcome == R_PARSED || s->outcome == R_MEMO) {
        kind = s->outcome == R_PARSED ? "parsed" : "memo";
        value = phase_b(&s->p, &s->c, s->outcome == R_PARSED ? A_OK : A_MEMO);
        if (value == Py_None) { /* phase B left it to Python (nesting, budget) */
            Py_DECREF(value);
            s->outcome = R_REFUSED;
        }
    }
    if (s->outcome == R_REFUSED) {
        kind = "data";
        value = PyBytes_FromStringAndSize((const char *)s->data, s->size);
    } else if (s->outcome == R_SKIP) {
        kind = "skip";
        value = Py_None;
        Py_INCREF(value);
    }
    Py_ssize_t size = s->size;
    double mtime = s->mtime;
    slot_free(s);
    if (!value) return NULL;
    PyObject *out = Py_BuildValue("(sNnd)", kind, value, size, mtime);
    return out;
}

static PyMethodDef reader_methods[] = {
    {"take", (PyCFunction)reader_take, METH_O,
     "take(i) -> (kind, value, size, mtime): dump i, in order (see the module)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ddp_autopsy.analyzer._frpickle.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(paths, threads=1, ahead=8): files read and parsed ahead on threads.",
    .tp_methods = reader_methods,
    .tp_init = (initproc)reader_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef methods[] = {
    {"parse", parse, METH_O, "A Flight Recorder pickle as columns, or None (see the module)."},
    {"join", join, METH_O, "One Column of several of one kind, in order."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frpickle",
                                    "Flight Recorder pickles straight to columns.", -1, methods};

PyMODINIT_FUNC PyInit__frpickle(void) {
    if (PyType_Ready(&ColumnType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ColumnType);
    if (PyModule_AddObject(m, "Column", (PyObject *)&ColumnType) < 0) return NULL;
    if (PyType_Ready(&ReaderType) < 0) return NULL;
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) return NULL;
    BAILED = PyList_New(0);
    if (!BAILED) return NULL;
    PyObject *names = PyTuple_New(NF);
    if (!names) return NULL;
    for (int f = 0; f < NF; f++) {
        PyObject *s = PyUnicode_FromString(FIELDS[f]);
        if (!s) return NULL;
        PyTuple_SET_ITEM(names, f, s);
    }
    if (PyModule_AddObject(m, "FIELDS", names) < 0) return NULL;
    return m;
}
