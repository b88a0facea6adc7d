/* Chat-template renderer tests.
 *
 * Conformance: the *.cases.json files in tests/data/chat_template hold conversations (and,
 * in constructs.cases.json, small templates) rendered by Jinja2 configured like
 * transformers (tools/gen_chat_cases.py); every case must render byte-identically,
 * or fail when Jinja2 failed (with the same message when the template called
 * raise_exception). Plus error-path and limit tests written here. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/chat_template.h"
#include "qd_test.h"

#define DATA "tests/data/chat_template"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) { free(p); p = NULL; }
    fclose(f);
    if (p) { p[n] = 0; *len = (size_t)n; }
    return p;
}

static void show_diff(const char *name, const char *want, size_t wn, const char *got, size_t gn) {
    size_t i = 0;
    while (i < wn && i < gn && want[i] == got[i]) i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "  %s: first difference at byte %zu (want %zu bytes, got %zu)\n", name, i, wn, gn);
    fprintf(stderr, "    want: ...%.*s...\n", (int)((wn - from) < 140 ? wn - from : 140), want + from);
    fprintf(stderr, "    got:  ...%.*s...\n", (int)((gn - from) < 140 ? gn - from : 140), got + from);
}

/* Runs one *.cases.json file; returns the number of cases run. */
static int run_cases(const char *file) {
    char path[512];
    snprintf(path, sizeof path, DATA "/%s", file);
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    CHECKF(doc != NULL, "%s: %s", path, je.text);
    if (!doc) return 0;
    qd_chat_template *shared = NULL;
    const char *tname = json_string_value(json_object_get(doc, "template"));
    qd_err err = {0};
    if (tname) {
        size_t n;
        snprintf(path, sizeof path, DATA "/%s", tname);
        char *src = slurp(path, &n);
        CHECKF(src != NULL, "cannot read %s", path);
        if (!src) { json_decref(doc); return 0; }
        qd_status s = qd_chat_template_compile(src, n, &shared, &err);
        CHECKF(s == QD_OK, "%s: %s", tname, err.msg);
        free(src);
        if (s != QD_OK) { json_decref(doc); return 0; }
    }
    json_t *cases = json_object_get(doc, "cases"), *cs;
    size_t i;
    int ran = 0;
    json_array_foreach(cases, i, cs) {
        const char *name = json_string_value(json_object_get(cs, "name"));
        qd_chat_template *tpl = shared;
        if (!tpl) {
            json_t *t = json_object_get(cs, "template");
            qd_status s = qd_chat_template_compile(json_string_value(t), json_string_length(t), &tpl, &err);
            json_t *cerr = json_object_get(cs, "compile_error");
            if (cerr) {
                CHECKF(s != QD_OK, "%s/%s: compiled but Jinja2 rejected it: %s", file, name, json_string_value(cerr));
                if (s == QD_OK) qd_chat_template_free(tpl);
                ran++;
                continue;
            }
            CHECKF(s == QD_OK, "%s/%s: compile failed: %s", file, name, err.msg);
            if (s != QD_OK) continue;
        }
        char *out = NULL;
        size_t out_len = 0;
        qd_status s = qd_chat_template_render_json(tpl, json_object_get(cs, "vars"), NULL, &out, &out_len, &err);
        json_t *exp = json_object_get(cs, "expected");
        if (exp) {
            int same = s == QD_OK && out_len == json_string_length(exp) && memcmp(out, json_string_value(exp), out_len) == 0;
            CHECKF(same, "%s/%s: %s", file, name, s == QD_OK ? "output differs" : err.msg);
            if (!same && s == QD_OK) show_diff(name, json_string_value(exp), json_string_length(exp), out, out_len);
        } else {
            const char *msg = json_string_value(json_object_get(cs, "error"));
            CHECKF(s != QD_OK, "%s/%s: rendered but Jinja2 failed with: %s", file, name, msg);
            if (s != QD_OK && json_is_true(json_object_get(cs, "raised")))
                CHECKF(strstr(err.msg, msg) != NULL, "%s/%s: error '%s' lacks raise_exception message '%s'", file, name,
                       err.msg, msg);
        }
        free(out);
        if (tpl != shared) qd_chat_template_free(tpl);
        ran++;
    }
    qd_chat_template_free(shared);
    json_decref(doc);
    return ran;
}

static qd_status render_str(const char *tpl_src, const char *vars, char **out, qd_err *err) {
    qd_chat_template *t;
    qd_status s = qd_chat_template_compile(tpl_src, strlen(tpl_src), &t, err);
    if (s != QD_OK) return s;
    s = qd_chat_template_render(t, vars, out, NULL, err);
    qd_chat_template_free(t);
    return s;
}

static void expect_compile_error(const char *src, const char *needle) {
    qd_chat_template *t = NULL;
    qd_err err = {0};
    qd_status s = qd_chat_template_compile(src, strlen(src), &t, &err);
    CHECKF(s != QD_OK && t == NULL, "compiled: %s", src);
    if (s != QD_OK) CHECKF(strstr(err.msg, needle) != NULL, "error '%s' lacks '%s'", err.msg, needle);
    qd_chat_template_free(t);
}

/* Small limits keep the limit tests quick; NULL = the defaults. */
static const qd_chat_template_limits SMALL = {1u << 20, 32u << 20, 2000000, 50};

static void expect_render_error_lim(const char *src, const char *vars, const char *needle,
                                    const qd_chat_template_limits *lim) {
    char *out = NULL;
    qd_err err = {0};
    qd_chat_template *t;
    qd_status s = qd_chat_template_compile(src, strlen(src), &t, &err);
    if (s == QD_OK) {
        json_t *j = json_loads(vars, 0, NULL);
        s = qd_chat_template_render_json(t, j, lim, &out, NULL, &err);
        json_decref(j);
        qd_chat_template_free(t);
    }
    CHECKF(s != QD_OK && out == NULL, "rendered: %s -> %.100s", src, out ? out : "");
    if (s != QD_OK) CHECKF(strstr(err.msg, needle) != NULL, "error '%s' lacks '%s'", err.msg, needle);
    free(out);
}

static void expect_render_error(const char *src, const char *vars, const char *needle) {
    char *out = NULL;
    qd_err err = {0};
    qd_status s = render_str(src, vars, &out, &err);
    CHECKF(s != QD_OK && out == NULL, "rendered: %s -> %s", src, out ? out : "");
    if (s != QD_OK) CHECKF(strstr(err.msg, needle) != NULL, "error '%s' lacks '%s'", err.msg, needle);
    free(out);
}

static void test_errors(void) {
    /* Unsupported constructs name themselves and the line. */
    expect_compile_error("a\nb\n{% include 'x.jinja' %}", "line 3: unsupported construct '{% include %}'");
    expect_compile_error("{% extends 'base' %}", "'{% extends %}'");
    expect_compile_error("\n{{ x | frobnicate }}", "line 2: unsupported construct: no filter named 'frobnicate'");
    expect_compile_error("{% if x is frob %}{% endif %}", "no test named 'frob'");
    expect_compile_error("{% for x in y recursive %}{% endfor %}", "recursive");
    /* Malformed templates: errors, not crashes. */
    expect_compile_error("{% if x %}never closed", "missing '{% endif %}'");
    expect_compile_error("{% for x in y %}", "missing '{% endfor %}'");
    expect_compile_error("{{ x ", "expected '}}'");
    expect_compile_error("{{ 'unterminated }}", "unterminated string");
    expect_compile_error("{# comment", "missing end of comment");
    expect_compile_error("{% endif %}", "no matching start tag");
    expect_compile_error("{{ (((1 }}", "expected");
    expect_compile_error("{{ 1 + }}", "unexpected");
    expect_compile_error("{% set %}", "expected variable name");
    expect_compile_error("{{ a.b.c[ }}", "line 1");
    /* raise_exception: its message comes back. */
    expect_render_error("x\n{{ raise_exception('Conversation roles must alternate!') }}", "{}",
                        "line 2: Conversation roles must alternate!");
    expect_render_error("\n{{ lipsum(2) }}", "{}", "line 2: 'lipsum' is undefined (unsupported global function?)");
    expect_render_error("{{ 'a'.zfill(3) }}", "{}", "'str' object has no method 'zfill'");
    expect_render_error("{{ '%5s' % 1 }}{{ '{:>5}'.format(1) }}", "{}", "format specs");
    /* Runtime type errors. */
    expect_render_error("{{ 'a' + 1 }}", "{}", "unsupported operand");
    expect_render_error("{{ nope.attr }}", "{}", "undefined");
    expect_render_error("{{ 1 // 0 }}", "{}", "by zero");
    expect_render_error("{{ x | tojson }}", "{}", "not JSON serializable");
    /* Limits: hostile templates stop with a clear error. */
    expect_render_error_lim("{% set r = range(1000) %}{% for i in r %}{% for j in r %}{% for k in r %}{% endfor %}{% endfor %}{% endfor %}",
                            "{}", "step limit", &SMALL);
    expect_render_error_lim("{% for i in range(100000) %}{% set x = range(100000) %}{% endfor %}", "{}", "limit", &SMALL);
    expect_render_error_lim("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}", "recursion depth", &SMALL);
    expect_render_error_lim("{% set s = 'xxxxxxxxxxxxxxxx' %}{% for i in range(1000000) %}{{ s }}{% endfor %}", "{}",
                            "output size limit", &SMALL);
    expect_render_error_lim("{% set s = 'x' * 100000 %}{{ ([s] * 1000) | join }}", "{}", "limit", &SMALL);
    expect_render_error_lim("{% set s = 'x' * 100000 %}{{ ([s] * 1000) | tojson }}", "{}", "limit", &SMALL);
    expect_render_error_lim("{% set ns = namespace(a=[1, 2]) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a | tojson }}", "{}",
                            "limit", &SMALL);
    expect_render_error_lim("{% set ns = namespace(a=[1, 2]) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a }}", "{}",
                            "limit", &SMALL);
    /* With the default limits too. */
    expect_render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}", "recursion depth");
    expect_render_error("{{ 'ab' * 4000000000 }}", "{}", "memory limit");
    expect_render_error("{{ range(100000000000) }}", "{}", "range()");
    {
        /* A namespace holding itself prints (depth-capped) instead of recursing forever. */
        char *out = NULL;
        qd_err err = {0};
        qd_status s = render_str("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{% set ns.me2 = ns %}{{ ns }}", "{}", &out, &err);
        CHECKF(s == QD_OK || strstr(err.msg, "limit"), "self namespace: %s", err.msg);
        free(out);
    }
    /* Bad request JSON. */
    expect_render_error("{{ messages }}", "{\"messages\": [", "bad JSON");
    expect_render_error("{{ messages }}", "[1, 2]", "JSON object");
}

static void test_api(void) {
    char *out = NULL;
    qd_err err = {0};
    /* Extra keys pass through as variables. */
    qd_status s = render_str("{{ bos_token }}|{{ messages[0].content }}|{{ custom.k }}",
                             "{\"bos_token\": \"<s>\", \"messages\": [{\"role\": \"user\", \"content\": \"hé\"}], \"custom\": {\"k\": 1.5}}",
                             &out, &err);
    CHECKF(s == QD_OK && out && strcmp(out, "<s>|hé|1.5") == 0, "got %s (%s)", out ? out : "NULL", err.msg);
    free(out);
    /* load_dir: tokenizer_config.json with a string template (the Qwen3 tokenizer in tests/data). */
    qd_chat_template *t = NULL;
    s = qd_chat_template_load_dir("tests/data/qwen3-tokenizer", &t, &err);
    CHECKF(s == QD_OK, "load_dir tests/data/qwen3-tokenizer: %s", err.msg);
    if (s == QD_OK) {
        s = qd_chat_template_render(t, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"add_generation_prompt\": true, \"enable_thinking\": false}",
                                    &out, NULL, &err);
        CHECKF(s == QD_OK && strcmp(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n") == 0,
               "qwen3 render: %s", s == QD_OK ? out : err.msg);
        free(out);
    }
    /* content as a list of text parts: Qwen3's template adds content to strings (the
     * parts go in joined), Qwen3.5's renders the list, the default model's adds too */
    CHECK(s != QD_OK || !qd_chat_template_renders_content_parts(t));
    /* its source, as the tokenizer_config.json holds it (what /tokenizer_info hands clients) */
    if (s == QD_OK) {
        size_t n = 0, fl = 0;
        const char *src = qd_chat_template_source(t, &n);
        char *cfg = qd_test_read_file("tests/data/qwen3-tokenizer/tokenizer_config.json", &fl);
        json_t *j = cfg ? json_loads(cfg, 0, NULL) : NULL;
        const char *want = json_string_value(json_object_get(j, "chat_template"));
        CHECKF(want && n == strlen(want) && !memcmp(src, want, n) && src[n] == 0, "the template's source (%zu bytes)",
               n);
        json_decref(j);
        free(cfg);
    }
    qd_chat_template_free(t);
    {
        size_t len = 0;
        char *src = slurp("tests/data/chat_template/qwen3_5.jinja", &len);
        t = NULL;
        s = src ? qd_chat_template_compile(src, len, &t, &err) : QD_ERR_NOT_FOUND;
        CHECKF(s == QD_OK && qd_chat_template_renders_content_parts(t), "qwen3_5.jinja renders content parts");
        qd_chat_template_free(t);
        free(src);
        t = NULL;
        s = qd_chat_template_load_dir("models/qdelta-tiny", &t, &err);
        CHECKF(s == QD_OK && !qd_chat_template_renders_content_parts(t), "the default model's template: string content");
        qd_chat_template_free(t);
    }
    /* load_dir: a list of named templates, and chat_template.jinja. */
    char dir[] = "/tmp/qd_ct_XXXXXX";
    if (mkdtemp(dir)) {
        char path[256];
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        FILE *f = fopen(path, "w");
        fputs("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", \"template\": \"D{{ 1 + 1 }}\"}]}", f);
        fclose(f);
        s = qd_chat_template_load_dir(dir, &t, &err);
        CHECKF(s == QD_OK, "load_dir list: %s", err.msg);
        if (s == QD_OK && qd_chat_template_render(t, "{}", &out, NULL, &err) == QD_OK) {
            CHECKF(strcmp(out, "D2") == 0, "list default: %s", out);
            free(out);
        }
        qd_chat_template_free(t);
        /* chat_template.jinja takes precedence over tokenizer_config.json */
        char jpath[256];
        snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
        f = fopen(jpath, "w");
        fputs("J{{ messages | length }}\n", f);
        fclose(f);
        s = qd_chat_template_load_dir(dir, &t, &err);
        CHECKF(s == QD_OK, "load_dir jinja: %s", err.msg);
        if (s == QD_OK && qd_chat_template_render(t, "{\"messages\": [1, 2]}", &out, NULL, &err) == QD_OK) {
            CHECKF(strcmp(out, "J2") == 0, "jinja file: %s", out);
            free(out);
        }
        qd_chat_template_free(t);
        remove(jpath);
        /* a list without "default" and a compile error both name the file */
        f = fopen(path, "w");
        fputs("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}]}", f);
        fclose(f);
        s = qd_chat_template_load_dir(dir, &t, &err);
        CHECKF(s == QD_ERR_NOT_FOUND && strstr(err.msg, "default"), "no default: %s", err.msg);
        f = fopen(path, "w");
        fputs("{\"chat_template\": \"{% if %}\"}", f);
        fclose(f);
        s = qd_chat_template_load_dir(dir, &t, &err);
        CHECKF(s == QD_ERR_FORMAT && strstr(err.msg, "tokenizer_config.json") && strstr(err.msg, "line 1"), "bad tpl: %s", err.msg);
        remove(path);
        s = qd_chat_template_load_dir(dir, &t, &err);
        CHECK(s == QD_ERR_NOT_FOUND && t == NULL);
        rmdir(dir);
    }
}

int main(void) {
    const char *files[] = {"constructs.cases.json", "qwen3.cases.json", "qwen3_5.cases.json", "qwen3_5_small.cases.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        int n = run_cases(files[i]);
        printf("%s: %d cases\n", files[i], n);
        CHECKF(n >= 20, "%s: only %d cases", files[i], n);
    }
    test_errors();
    test_api();
    return qd_test_finish("test_chat_template");
}
