/* api_completions.h -- OpenAI-compatible /v1/completions (with server-sent
 * events when "stream": true) and the tokenizer endpoints lm-eval's
 * local-completions model calls (/tokenize, /detokenize, /tokenizer_info). */
#ifndef NC_SERVER_API_COMPLETIONS_H
#define NC_SERVER_API_COMPLETIONS_H

#include "http.h"

void api_h_completions(nc_server *srv, http_request *req, http_response *resp);
/* POST /v1/chat/completions: 404 naming /v1/completions (a word-level
 * model has no chat template; OpenAI clients set up for chat learn where
 * to go instead of meeting a bare 404). */
void api_h_chat_completions(nc_server *srv, http_request *req, http_response *resp);
void api_h_tokenize(nc_server *srv, http_request *req, http_response *resp);
void api_h_detokenize(nc_server *srv, http_request *req, http_response *resp);
void api_h_tokenizer_info(nc_server *srv, http_request *req, http_response *resp);

#endif
