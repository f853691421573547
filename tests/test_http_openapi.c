/* test_http_openapi.c -- proto/openapi.yaml against the code: it parses
 * (libyaml), every route of the route table is documented with its method
 * and every documented operation is routed (the table's last row being the
 * 404/405 fallback), and the Error schema's code
 * enum is exactly proto's error table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "routes.h"
#include "harness.h"
#include "proto.h"

static yaml_document_t doc;
static int loaded;

/* The value of key in mapping node n, or NULL. */
static yaml_node_t *get(yaml_node_t *n, const char *key)
{
    if (!n || n->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(&doc, p->key);
        if (k && k->type == YAML_SCALAR_NODE && strcmp((const char *)k->data.scalar.value, key) == 0)
            return yaml_document_get_node(&doc, p->value);
    }
    return NULL;
}

static const char *scalar(yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static void lower(const char *s, char *out, size_t cap)
{
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++) out[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] + 32 : s[i]);
    out[i] = 0;
}

TEST(parses)
{
    FILE *f = fopen("proto/openapi.yaml", "rb");
    CHECKF(f != NULL, "cannot open proto/openapi.yaml (run from the repository root)");
    if (!f) return;
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    int ok = yaml_parser_load(&parser, &doc);
    CHECKF(ok, "YAML error: %s at line %zu", parser.problem ? parser.problem : "?", parser.problem_mark.line + 1);
    yaml_parser_delete(&parser);
    fclose(f);
    if (!ok) return;
    loaded = 1;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    CHECK(root && root->type == YAML_MAPPING_NODE);
    const char *v = scalar(get(root, "openapi"));
    CHECK(v && strncmp(v, "3.", 2) == 0);
    CHECK(get(get(root, "info"), "title") != NULL);
}

TEST(every_route_documented)
{
    if (!loaded) return;
    yaml_node_t *paths = get(yaml_document_get_root_node(&doc), "paths");
    CHECK(paths && paths->type == YAML_MAPPING_NODE);
    int n;
    const http_route *rt = routes_table(&n);
    CHECK(n > 10);
    int fallback = 0;
    for (int i = 0; i < n; i++) {
        char m[16];
        if (!rt[i].method) {      /* the last row: 404/405 for everything else */
            fallback++;
            CHECK(i == n - 1 && rt[i].handler != NULL);
            continue;
        }
        lower(rt[i].method, m, sizeof m);
        yaml_node_t *op = get(get(paths, rt[i].pattern), m);
        CHECKF(op != NULL, "route %s %s is not in proto/openapi.yaml", rt[i].method, rt[i].pattern);
        CHECKF(get(op, "responses") != NULL, "%s %s has no responses", rt[i].method, rt[i].pattern);
    }
    CHECK(fallback == 1);
}

TEST(every_operation_routed)
{
    if (!loaded) return;
    yaml_node_t *paths = get(yaml_document_get_root_node(&doc), "paths");
    if (!paths || paths->type != YAML_MAPPING_NODE) return;
    int n, ops = 0;
    const http_route *rt = routes_table(&n);
    static const char *const methods[] = {"get", "put", "post", "delete", "patch", "head", "options", NULL};
    for (yaml_node_pair_t *p = paths->data.mapping.pairs.start; p < paths->data.mapping.pairs.top; p++) {
        const char *path = scalar(yaml_document_get_node(&doc, p->key));
        yaml_node_t *item = yaml_document_get_node(&doc, p->value);
        for (int k = 0; methods[k]; k++) {
            if (!get(item, methods[k])) continue;
            ops++;
            int found = 0;
            for (int i = 0; i < n; i++)
                found |= rt[i].method && strcmp(rt[i].pattern, path) == 0 && strcasecmp(rt[i].method, methods[k]) == 0;
            CHECKF(found, "proto/openapi.yaml documents %s %s, which no route serves", methods[k], path);
        }
    }
    CHECKF(ops == n - 1, "%d documented operations, %d routes", ops, n - 1);
}

TEST(error_codes_match_proto)
{
    if (!loaded) return;
    yaml_node_t *e = get(get(get(get(get(get(get(yaml_document_get_root_node(&doc), "components"), "schemas"),
                                             "Error"), "properties"), "error"), "properties"), "code");
    yaml_node_t *en = get(e, "enum");
    CHECK(en && en->type == YAML_SEQUENCE_NODE);
    if (!en || en->type != YAML_SEQUENCE_NODE) return;
    size_t listed = (size_t)(en->data.sequence.items.top - en->data.sequence.items.start);
    CHECKF(listed == API_ERROR_COUNT - 1, "%zu codes documented, proto has %d", listed, API_ERROR_COUNT - 1);
    for (int c = 1; c < API_ERROR_COUNT; c++) {
        const char *code = proto_error_code((api_error)c);
        int found = 0;
        for (yaml_node_item_t *it = en->data.sequence.items.start; it < en->data.sequence.items.top; it++) {
            const char *s = scalar(yaml_document_get_node(&doc, *it));
            found |= s && strcmp(s, code) == 0;
        }
        CHECKF(found, "error code %s (HTTP %u) is not in the Error schema", code, proto_http_status((api_error)c));
    }
}

int main(void)
{
    RUN(parses);
    RUN(every_route_documented);
    RUN(every_operation_routed);
    RUN(error_codes_match_proto);
    if (loaded)
        yaml_document_delete(&doc);
    return harness_summary();
}
