/* oneOf exclusivity (json_schema_int.h): the grammar of oneOf is the union of its
 * branches, which is right only when no value can validate against two of them. This
 * file decides that where it can from the schemas alone, conservatively: a pair of
 * branches is accepted as exclusive when every value one branch's grammar generates
 * is invalid against the other, for one of these reasons:
 *   - their types do not meet (integer and number count as one type);
 *   - both are const / enum with no value in common;
 *   - objects: a property one branch requires (so every value it generates has it)
 *     is refused by the other (its schema there excludes the value's, or the other
 *     does not list it and has additionalProperties false), e.g. a discriminator
 *     {"kind": {"const": "a"}} against {"kind": {"const": "b"}};
 *   - an anyOf / oneOf branch whose every member is exclusive.
 * Any other pair (numeric ranges, string patterns, ...) is refused with the path of
 * the oneOf and the two branches: accepting it could let a value through that matches
 * both, which oneOf forbids. */
#include <math.h>
#include <string.h>

#include "runtime/grammar/json_schema_int.h"

#define MAX_DEPTH 24

enum { T_NULL = 1, T_BOOL = 2, T_NUM = 4, T_STR = 8, T_ARR = 16, T_OBJ = 32, T_ALL = 63 };

static int type_bit(const char *t) {
    if (!strcmp(t, "null")) return T_NULL;
    if (!strcmp(t, "boolean")) return T_BOOL;
    if (!strcmp(t, "integer") || !strcmp(t, "number")) return T_NUM;
    if (!strcmp(t, "string")) return T_STR;
    if (!strcmp(t, "array")) return T_ARR;
    if (!strcmp(t, "object")) return T_OBJ;
    return T_ALL;
}

static int value_bit(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL: return T_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return T_BOOL;
    case JSON_INTEGER:
    case JSON_REAL: return T_NUM;
    case JSON_STRING: return T_STR;
    case JSON_ARRAY: return T_ARR;
    default: return T_OBJ;
    }
}

/* The schema behind $ref and a one-member allOf (NULL when it does not resolve). */
static const json_t *unwrap(sc_ctx *c, const json_t *s) {
    for (int k = 0; k < MAX_DEPTH && json_is_object(s); k++) {
        const json_t *ref = json_object_get(s, "$ref"), *all = json_object_get(s, "allOf");
        if (json_is_string(ref)) s = sc_resolve_ref(c, json_string_value(ref));
        else if (json_is_array(all) && json_array_size(all) == 1) s = json_array_get(all, 0);
        else return s;
    }
    return json_is_object(s) ? NULL : s;
}

static const json_t *values_of(const json_t *s) {
    return json_object_get(s, "enum") ? json_object_get(s, "enum") : NULL;
}

/* The types of the values validating against s (T_ALL when not bounded by a type). */
static int valid_types(const json_t *s) {
    if (!json_is_object(s)) return json_is_false(s) ? 0 : T_ALL;
    const json_t *t = json_object_get(s, "type"), *cst = json_object_get(s, "const"), *en = values_of(s);
    int m = T_ALL;
    if (json_is_string(t)) m = type_bit(json_string_value(t));
    else if (json_is_array(t)) {
        m = 0;
        size_t i;
        const json_t *v;
        json_array_foreach(t, i, v) m |= json_is_string(v) ? type_bit(json_string_value(v)) : T_ALL;
    }
    if (cst) m &= value_bit(cst);
    if (json_is_array(en)) {
        int e = 0;
        size_t i;
        const json_t *v;
        json_array_foreach(en, i, v) e |= value_bit(v);
        m &= e;
    }
    return m;
}

/* JSON Schema equality of instances: numbers by value (1 = 1.0). */
static int same_value(const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal(a, b);
}

static int in_values(const json_t *v, const json_t *s) {
    const json_t *cst = json_object_get(s, "const"), *en = values_of(s);
    if (cst) return same_value(v, cst);
    size_t i;
    const json_t *x;
    json_array_foreach(en, i, x) if (same_value(v, x)) return 1;
    return 0;
}

static int excludes(sc_ctx *c, const json_t *a, const json_t *b, int depth);

/* 1 when every value generated for a (one of its anyOf / oneOf members) fails b. */
static int members_exclude(sc_ctx *c, const json_t *list, const json_t *b, int depth) {
    size_t i;
    const json_t *m;
    json_array_foreach(list, i, m) if (!excludes(c, m, b, depth + 1)) return 0;
    return json_array_size(list) > 0;
}

/* 1 when a value generated for the object schema a is refused by b's object keywords. */
static int object_excludes(sc_ctx *c, const json_t *a, const json_t *b, int depth) {
    const json_t *ap = json_object_get(a, "properties"), *bp = json_object_get(b, "properties");
    const json_t *badd = json_object_get(b, "additionalProperties");
    size_t i;
    const json_t *k;
    json_array_foreach(json_object_get(a, "required"), i, k) {
        if (!json_is_string(k)) continue;
        const char *key = json_string_value(k);
        const json_t *as = json_object_get(ap, key);
        const json_t *bs = json_object_get(bp, key);
        if (!as) continue; /* generated only from its schema */
        if (bs) {
            if (excludes(c, as, bs, depth + 1)) return 1;
        } else if (json_is_false(badd) && json_is_object(bp)) {
            return 1;
        } else if (json_is_object(badd) && !json_is_object(bp) && excludes(c, as, badd, depth + 1)) {
            return 1;
        }
    }
    return 0;
}

static int excludes(sc_ctx *c, const json_t *a, const json_t *b, int depth) {
    if (depth > MAX_DEPTH) return 0;
    a = unwrap(c, a);
    b = unwrap(c, b);
    if (!a || !b) return 0;
    if (json_is_false(b) || json_is_false(a)) return 1;
    if (!json_is_object(a) || !json_is_object(b)) return 0; /* true: anything */
    const json_t *alist = json_object_get(a, "anyOf") ? json_object_get(a, "anyOf") : json_object_get(a, "oneOf");
    if (json_is_array(alist)) return members_exclude(c, alist, b, depth);
    const json_t *blist = json_object_get(b, "anyOf") ? json_object_get(b, "anyOf") : json_object_get(b, "oneOf");
    if (json_is_array(blist)) {
        size_t i;
        const json_t *m;
        json_array_foreach(blist, i, m) if (!excludes(c, a, m, depth + 1)) return 0;
        return json_array_size(blist) > 0;
    }
    /* a's grammar generates no more types than validate against it, and only objects
     * when it has object keywords and no type (implied_type in json_schema.c) */
    int ta = valid_types(a);
    if (!json_object_get(a, "type") &&
        (json_object_get(a, "properties") || json_object_get(a, "required") || json_object_get(a, "additionalProperties")))
        ta &= T_OBJ;
    const int tb = valid_types(b);
    if (!(ta & tb)) return 1;
    const int a_lit = json_object_get(a, "const") || json_is_array(values_of(a));
    const int b_lit = json_object_get(b, "const") || json_is_array(values_of(b));
    if (a_lit && b_lit) {
        const json_t *cst = json_object_get(a, "const");
        if (cst) return !in_values(cst, b);
        size_t i;
        const json_t *v;
        json_array_foreach(values_of(a), i, v) if (in_values(v, b)) return 0;
        return 1;
    }
    if (a_lit) return 0; /* a literal of a type b admits: not decided here */
    /* the values of a that b's types admit are objects (compiled from a's object
     * keywords): b must refuse every one */
    if ((ta & tb) == T_OBJ) return object_excludes(c, a, b, depth);
    return 0;
}

int sc_oneof_exclusive(sc_ctx *c, const json_t *list, const char *path) {
    size_t n = json_array_size(list);
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            const json_t *a = json_array_get(list, i), *b = json_array_get(list, j);
            if (excludes(c, a, b, 0) && excludes(c, b, a, 0)) continue;
            return sc_fail(c, QD_ERR_UNSUPPORTED,
                           "unsupported keyword 'oneOf' at %s: branches %zu and %zu may both match one value, and "
                           "exclusivity can be enforced only between branches of different types, different "
                           "const / enum values, or objects told apart by a required property (use 'anyOf' if a "
                           "value may match both)",
                           path, i, j);
        }
    return 0;
}
