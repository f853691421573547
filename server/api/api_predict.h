/* api_predict.h -- reading and predicting text:
 *   POST /v1/sessions/{id}/feed      tokens into a session (its namespace too with
 *                                    "adapt"), with their log-probabilities and the
 *                                    components' shares when asked
 *   POST /v1/sessions/{id}/predict   the next word's distribution (top k or full),
 *                                    components, explain, after its own "text";
 *                                    batched across sessions when the batcher
 *                                    runs (batcher.h)
 *   POST /v1/score                   stateless scoring of a text
 * Every budget of config [limits] is checked before the work starts. */
#ifndef NC_SERVER_API_PREDICT_H
#define NC_SERVER_API_PREDICT_H

#include "http.h"

void api_h_feed(nc_server *srv, http_request *req, http_response *resp);
/* A feed of a few words (text shorter than max_predict_text_tokens bytes,
 * so at most that many tokens, as a predict's "text"), without "adapt"
 * (its group commit waits for the disk) or "components" (a full
 * distribution a token): run in its connection's thread, as a predict,
 * rather than queued for a worker (http_route.light). */
bool api_feed_is_light(const nc_server *srv, const http_request *req);
void api_h_predict(nc_server *srv, http_request *req, http_response *resp);
void api_h_score(nc_server *srv, http_request *req, http_response *resp);

#endif
