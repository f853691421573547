/* commands.h -- the neurocache CLI's subcommands, one file each (cmd_*.c). */
#ifndef NC_COMMANDS_H
#define NC_COMMANDS_H

/* Each returns the process exit status: 0 success, 1 runtime failure,
 * 2 usage error. argv[0] is the subcommand name. */
int cmd_score(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_fit_gate(int argc, char **argv);
int cmd_build_index(int argc, char **argv);
int cmd_migrate(int argc, char **argv);
int cmd_dyn_stats(int argc, char **argv);
/* run `neurocached backup|restore` (server/domain/backup.h) */
int cmd_backup(int argc, char **argv);
int cmd_restore(int argc, char **argv);

#endif
