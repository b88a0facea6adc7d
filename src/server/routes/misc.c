/* GET /v1/models, /health and /metrics. */
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

void srv_route_models(srv_server *s, srv_reply *r) {
    json_t *m = json_pack("{s:s, s:s, s:i, s:s, s:s, s:i}", "id", s->cfg.model_name, "object", "model", "created",
                          (json_int_t)s->created, "owned_by", "qdelta", "root", s->cfg.model_dir, "max_model_len",
                          s->cfg.engine.max_model_len);
    json_t *o = json_pack("{s:s, s:[o]}", "object", "list", "data", m);
    r->status = 200;
    r->body = json_dumps(o, JSON_COMPACT);
    r->content_type = "application/json";
    json_decref(o);
}

void srv_route_health(srv_server *s, srv_reply *r) {
    int down = __atomic_load_n(&s->shutting_down, __ATOMIC_RELAXED);
    r->status = down ? 503 : 200;
    r->body = strdup(down ? "{\"status\":\"shutting down\"}" : "{\"status\":\"ok\"}");
    r->content_type = "application/json";
}

void srv_route_metrics(srv_server *s, srv_reply *r) {
    qd_engine_stats st;
    int have = 0;
    pthread_rwlock_rdlock(&s->engine_lock);
    if (s->engine) {
        qd_engine_get_stats(s->engine, &st);
        have = 1;
    }
    pthread_rwlock_unlock(&s->engine_lock);
    r->status = 200;
    r->body = srv_metrics_render(&s->metrics, have ? &st : NULL, __atomic_load_n(&s->n_gens, __ATOMIC_RELAXED));
    r->content_type = "text/plain; version=0.0.4; charset=utf-8";
}
