/* runtime/config_yaml.h — YAML text onto a Config (DESIGN 6), private to runtime/config*.
 *
 * Both functions walk libyaml's event stream and store each value through the key table
 * (runtime/config_keys.h): they check YAML types, unknown and duplicate keys, and fail
 * through fatal(EXIT_CONFIG, ...) naming the key and where it was written. Ranges and
 * combinations are not checked here (config.c validates once every override is applied).
 */
#ifndef FATHOM_RUNTIME_CONFIG_YAML_H
#define FATHOM_RUNTIME_CONFIG_YAML_H

#include "runtime/config.h"

/* Applies a whole YAML document over `config`; `origin` (a file name) starts messages,
 * followed by :line:column. Empty text changes nothing. */
void config_yaml_apply_text(Config *config, const char *text, const char *origin);

/* Applies one `--set` argument "dotted.key=value"; the value is read as YAML (a scalar, a
 * flow sequence such as [1, 2], or a flow mapping for a section). */
void config_yaml_apply_override(Config *config, const char *assignment);

#endif
