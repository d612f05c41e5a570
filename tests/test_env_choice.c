/* tests/test_env_choice.c — env_choice (runtime/error.h): the switches that pick among
 * kernels or walks read their variable the same way everywhere. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "runtime/error.h"

static const char *const kinds[] = {"fused", "composed", "per_site"};

Test(env_choice, unset_or_empty_is_the_first_choice)
{
    unsetenv("FATHOM_TEST_CHOICE");
    cr_expect_eq(env_choice("FATHOM_TEST_CHOICE", kinds, 3), 0);
    setenv("FATHOM_TEST_CHOICE", "", 1);
    cr_expect_eq(env_choice("FATHOM_TEST_CHOICE", kinds, 3), 0);
}

Test(env_choice, a_named_choice_is_its_index)
{
    setenv("FATHOM_TEST_CHOICE", "per_site", 1);
    cr_expect_eq(env_choice("FATHOM_TEST_CHOICE", kinds, 3), 2);
    setenv("FATHOM_TEST_CHOICE", "composed", 1);
    cr_expect_eq(env_choice("FATHOM_TEST_CHOICE", kinds, 3), 1);
    setenv("FATHOM_TEST_CHOICE", "fused", 1);
    cr_expect_eq(env_choice("FATHOM_TEST_CHOICE", kinds, 3), 0);
}

/* a value that is none of them (here a prefix of one) is a config error: exit 2 */
Test(env_choice, any_other_value_exits_2, .exit_code = 2)
{
    setenv("FATHOM_TEST_CHOICE", "fuse", 1);
    env_choice("FATHOM_TEST_CHOICE", kinds, 3);
}
