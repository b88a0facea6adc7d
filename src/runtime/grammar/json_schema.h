/* JSON Schema -> grammar (grammar.h) of the JSON texts that validate.
 *
 * Coverage: type (a name or an array of names, null included); properties / required
 * / additionalProperties; enum; const; anyOf; oneOf (the union of its branches, when
 * they provably cannot both match a value: different types, different const / enum
 * values, objects told apart by a required property; any other oneOf is refused with
 * QD_ERR_UNSUPPORTED naming its path and the two branches: json_schema_oneof.c); allOf with one
 * member; $ref to "#", "#/$defs/NAME", "#/definitions/NAME" or any JSON pointer into
 * the root (recursive references included); items, minItems, maxItems; minLength,
 * maxLength, format (date, time, date-time, uuid, email), pattern (a regular-expression
 * subset: json_schema_pattern.c); minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum (draft 6+ numbers) for integers and numbers.
 * Annotations are ignored: title, description, default, examples, $schema, $id,
 * $comment, deprecated, readOnly, writeOnly. Every other keyword is refused with
 * QD_ERR_UNSUPPORTED naming it and its path (e.g. "#/properties/a/pattern").
 *
 * The grammar generates a subset of the valid texts, chosen so that a model cannot
 * wander: compact JSON with at most one space after ':' and ','; properties in the
 * schema's order; no properties beyond those listed when `properties` is given
 * (additionalProperties applies to objects that list none); integers of at most 15
 * digits, fractions of at most 15 digits, no exponents; \u escapes that are not
 * surrogates. Every text of the grammar validates against the schema.
 *
 * Errors: QD_ERR_INVALID_ARG for an invalid schema (a keyword of the wrong type, an
 * unknown type name, a bad $ref, bounds no value meets), QD_ERR_UNSUPPORTED for a
 * keyword outside the coverage, QD_ERR_CAPACITY for a schema whose grammar would be
 * too large (QD_SCHEMA_MAX_REPEAT bounds minLength/maxLength/minItems/maxItems). */
#ifndef QD_RUNTIME_GRAMMAR_JSON_SCHEMA_H
#define QD_RUNTIME_GRAMMAR_JSON_SCHEMA_H

#include <jansson.h>

#include "base/err.h"
#include "runtime/grammar/grammar.h"

#define QD_SCHEMA_MAX_REPEAT 2048
#define QD_SCHEMA_MAX_NESTING 64

/* Adds the rules of `schema` (its own root for $ref) to g; returns the rule of its
 * values, or -1 with err set. */
int qd_json_schema_rule(qd_grammar *g, const json_t *schema, qd_err *err);
/* The rule of any JSON value, and of any JSON object. */
int qd_json_any_value_rule(qd_grammar *g);
int qd_json_any_object_rule(qd_grammar *g);
/* A finished grammar of the values of `schema` (any object when schema is NULL:
 * response_format json_object). */
qd_status qd_json_schema_grammar(const json_t *schema, qd_grammar **out, qd_err *err);

#endif
