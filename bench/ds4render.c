/* ds4render: antirez/ds4's own chat prompt renderer, for checking ds4tui's DeepSeek V4 template
 * (engine/text/dsv4_chat.py) against it byte for byte. Compiled with ds4_server.c included
 * (as ds4's own tests/ds4_test.c does: DS4_SERVER_TEST and _NO_MAIN drop its main), so the request is read
 * by ds4-server's parser (parse_messages, parse_tools_value) and rendered by its
 * render_chat_prompt_text. No model is opened.
 *
 *   ds4render none|high|max < request.json     (an OpenAI chat request: "messages", "tools")
 *
 * prints the prompt text ds4-server would tokenize, without a trailing newline.
 * Built by bench/ds4_reference.sh beside ds4ref. */
#define DS4_SERVER_TEST
#define DS4_SERVER_TEST_NO_MAIN
#include "ds4_server.c"

static char *read_stdin(void) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, stdin)) > 0) {
        len += n;
        if (cap - len < 2) buf = realloc(buf, cap *= 2);
    }
    if (!buf) exit(2);
    buf[len] = '\0';
    return buf;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: ds4render none|high|max < request.json\n");
        return 2;
    }
    ds4_think_mode mode = !strcmp(argv[1], "none") ? DS4_THINK_NONE
                        : !strcmp(argv[1], "max") ? DS4_THINK_MAX : DS4_THINK_HIGH;
    char *body = read_stdin();
    const char *p = body;
    chat_msgs msgs = {0};
    tool_schema_orders orders = {0};
    char *schemas = NULL;
    json_ws(&p);
    if (*p++ != '{') goto bad;
    json_ws(&p);
    while (*p && *p != '}') {
        char *key = NULL;
        if (!json_string(&p, &key)) goto bad;
        json_ws(&p);
        if (*p++ != ':') goto bad;
        bool ok = !strcmp(key, "messages") ? parse_messages(&p, &msgs)
                : !strcmp(key, "tools") ? parse_tools_value(&p, &schemas, &orders)
                : json_skip_value(&p);
        free(key);
        if (!ok) goto bad;
        json_ws(&p);
        if (*p == ',') p++;
        json_ws(&p);
    }
    char *prompt = render_chat_prompt_text(&msgs, schemas, &orders, mode);
    fputs(prompt, stdout);
    free(prompt);
    return 0;
bad:
    fprintf(stderr, "ds4render: ds4 could not parse the request\n");
    return 1;
}
