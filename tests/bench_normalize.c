/* bench_normalize.c -- the text normaliser's cost and what it does to the
 * unknown-word rate: each FILE tokenised by a model directory's tokenizer
 * normalised (its "text" conventions) and not (white-space split), runs
 * interleaved (A B A B ...) since the machine is shared; prints tokens,
 * unknown words and tokens/s of each, best of the runs.
 *
 * usage: bench_normalize [--model DIR] [--runs N] [--dump OUT] FILE...
 * --dump writes the normalised tokens of the files to OUT, a sentence per
 * line as the .ptb.txt corpora are written (to compare with them).
 * Exits 0 with a notice when the model or a file is absent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "buf.h"
#include "daemon.h"   /* now_s */
#include "model.h"
#include "tokenizer.h"

int main(int argc, char **argv)
{
    const char *dir = "models/demo", *dump = NULL;
    int runs = 3, a = 1;
    for (; a < argc && !strncmp(argv[a], "--", 2); a += 2) {
        if (a + 1 >= argc) {
            fprintf(stderr, "bench_normalize: %s needs a value\n", argv[a]);
            return 2;
        }
        if (!strcmp(argv[a], "--model"))
            dir = argv[a + 1];
        else if (!strcmp(argv[a], "--dump"))
            dump = argv[a + 1];
        else if (!strcmp(argv[a], "--runs"))
            runs = atoi(argv[a + 1]) > 0 ? atoi(argv[a + 1]) : 1;
        else {
            fprintf(stderr, "usage: bench_normalize [--model DIR] [--runs N] [--dump OUT] FILE...\n");
            return 2;
        }
    }
    nc_model *m = NULL;
    char err[NC_ERRLEN];
    if (model_load(dir, &m, err, sizeof err) != NC_OK) {
        printf("bench_normalize: skipped (%s)\n", err);
        return 0;
    }
    if (!m->cfg.text.declared)
        printf("note: %s declares no text conventions: both columns split on white space\n", dir);
    FILE *df = dump ? fopen(dump, "w") : NULL;
    if (dump && !df) {
        perror(dump);
        return 1;
    }
    printf("%-44s %-10s %10s %10s %8s %12s\n", "file", "mode", "tokens", "unknown", "unk %", "tokens/s");
    for (; a < argc; a++) {
        nc_buf b = NC_BUF_INIT;
        if (buf_read_file(&b, argv[a], err, sizeof err) != NC_OK) {
            printf("bench_normalize: %s, skipped\n", err);
            buf_free(&b);
            continue;
        }
        const char *text = b.data ? b.data : "";
        size_t len = b.len;
        double best[2] = {0, 0};
        size_t ntok[2] = {0, 0}, nunk[2] = {0, 0};
        for (int r = 0; r < runs; r++) {
            for (int mode = 0; mode < 2; mode++) {   /* 0 normalised, 1 white space */
                nc_tokens t;
                tokens_init(&t);
                double t0 = now_s();
                int rc = tokenize_ex(m, text, len, true, mode == 0, &t, err, sizeof err);
                double dt = now_s() - t0;
                if (rc != NC_OK) {
                    fprintf(stderr, "bench_normalize: %s: %s\n", argv[a], err);
                    return 1;
                }
                ntok[mode] = t.n;
                for (size_t i = 0; df && mode == 0 && r == 0 && i < t.n; i++)
                    fprintf(df, t.ids[i] == m->eos_id ? "\n" : " %s", t.words[i]);
                nunk[mode] = tokens_count_unk(m, &t, 0);
                if (dt > 0 && (double)t.n / dt > best[mode])
                    best[mode] = (double)t.n / dt;
                tokens_clear(&t);
            }
        }
        for (int mode = 0; mode < 2; mode++)
            printf("%-44s %-10s %10zu %10zu %7.2f%% %12.0f\n", argv[a], mode ? "whitespace" : "normalised",
                   ntok[mode], nunk[mode], ntok[mode] ? 100.0 * (double)nunk[mode] / (double)ntok[mode] : 0.0,
                   best[mode]);
        buf_free(&b);
    }
    if (df)
        fclose(df);
    model_free(m);
    return 0;
}
