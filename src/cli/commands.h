/* One entry point per CLI command; argv[0] is the command name. Return the exit code. */
#ifndef QD_CLI_COMMANDS_H
#define QD_CLI_COMMANDS_H

int qd_cmd_logits(int argc, char **argv);
int qd_cmd_perplexity(int argc, char **argv);
int qd_cmd_run(int argc, char **argv);
int qd_cmd_bench(int argc, char **argv);
int qd_cmd_chat(int argc, char **argv);
int qd_cmd_tokenize(int argc, char **argv);
int qd_cmd_detokenize(int argc, char **argv);
int qd_cmd_render_chat(int argc, char **argv);
int qd_cmd_serve(int argc, char **argv);

#endif
