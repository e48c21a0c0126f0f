package dev.kvant.server;

import com.fasterxml.jackson.databind.JsonNode;
import dev.kvant.tokenizer.ChatMessage;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Set;

/**
 * A validated {@code /v1/chat/completions} or {@code /v1/completions} request. Every field is checked for its type
 * and range; a field the API does not have is refused (as OpenAI does), and so is a feature kvant does not offer
 * (tools, logprobs, n above 1, ...). A few fields are accepted and ignored because they change nothing here
 * ({@code user}, {@code metadata}, {@code store}, ...); docs/SERVER.md lists them.
 *
 * @param messages     the conversation (chat), else null
 * @param prompt       the prompt text (text completion given as a string), else null
 * @param promptTokens the prompt as token ids (text completion given as ids), else null
 * @param maxTokens    the most tokens to generate, null for "until the context is full"
 * @param repeatLastN  the tokens the penalties look back, -1 the whole context
 * @param seed         the sampler's seed, null for a random one
 */
record CompletionRequest(Kind kind, List<ChatMessage> messages, String prompt, int[] promptTokens, Integer maxTokens,
                         float temperature, float topP, int topK, float minP, float repeatPenalty, int repeatLastN,
                         float frequencyPenalty, float presencePenalty, Long seed,
                         List<String> stop, boolean stream, boolean includeUsage, boolean ignoreEos) {

    enum Kind { CHAT, TEXT }

    /** The tokens the repetition penalty looks back when a request does not say (llama.cpp's default). */
    static final int DEFAULT_REPEAT_LAST_N = 64;

    private static final Set<String> COMMON = Set.of("model", "max_tokens", "temperature", "top_p", "n", "stream",
            "stream_options", "stop", "seed", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
            "frequency_penalty", "presence_penalty", "logit_bias", "logprobs", "top_k", "min_p", "repeat_penalty",
            "repeat_last_n",
            "ignore_eos");
    private static final Set<String> CHAT_ONLY = Set.of("messages", "max_completion_tokens", "top_logprobs",
            "response_format", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call", "metadata",
            "store", "service_tier", "modalities", "reasoning_effort", "verbosity", "prediction", "audio",
            "web_search_options");
    private static final Set<String> TEXT_ONLY = Set.of("prompt", "echo", "suffix", "best_of");
    private static final Set<String> ROLES = Set.of("system", "developer", "user", "assistant");
    /** A message's fields: what kvant reads (role, content), what it refuses when set (tool_calls), the rest ignored. */
    private static final Set<String> MESSAGE_FIELDS = Set.of("role", "content", "name", "tool_calls", "refusal",
            "function_call", "audio");
    private static final Set<String> STREAM_OPTIONS = Set.of("include_usage", "include_obfuscation");

    static CompletionRequest parse(Kind kind, JsonNode body) {
        for (Iterator<String> it = body.fieldNames(); it.hasNext(); ) {
            String f = it.next();
            if (!COMMON.contains(f) && !(kind == Kind.CHAT ? CHAT_ONLY : TEXT_ONLY).contains(f)) {
                throw ApiException.invalid(f, "Unrecognized request argument supplied: " + f);
            }
        }
        Fields b = new Fields(body);
        b.string("model");
        // hints about the caller and OpenAI's own prompt cache: checked, then ignored (kvant's prefix cache needs none)
        b.string("user");
        b.string("safety_identifier");
        b.string("prompt_cache_key");
        b.string("prompt_cache_retention");
        Double frequency = b.number("frequency_penalty", -2, 2);
        Double presence = b.number("presence_penalty", -2, 2);
        Integer n = b.integer("n", 1, 128);
        if (n != null && n != 1) {
            throw ApiException.unsupported("n", "n must be 1: kvant generates one choice per request");
        }
        JsonNode bias = b.object("logit_bias");
        if (bias != null && !bias.isEmpty()) {
            throw ApiException.unsupported("logit_bias", "logit_bias is not supported");
        }
        List<ChatMessage> messages = null;
        String prompt = null;
        int[] promptTokens = null;
        Integer maxTokens = b.integer("max_tokens", 1, Integer.MAX_VALUE);
        if (kind == Kind.CHAT) {
            messages = messages(body.get("messages"));
            Integer mct = b.integer("max_completion_tokens", 1, Integer.MAX_VALUE);
            if (mct != null) {
                maxTokens = maxTokens == null ? mct : Math.min(maxTokens, mct);
            }
            Boolean logprobs = b.bool("logprobs");
            Integer top = b.integer("top_logprobs", 0, 20);
            if (Boolean.TRUE.equals(logprobs) || top != null && top > 0) {
                throw ApiException.unsupported("logprobs", "logprobs are not supported");
            }
            JsonNode format = b.object("response_format");
            if (format != null && !"text".equals(format.path("type").asText(null))) {
                throw ApiException.unsupported("response_format", "response_format must be {\"type\": \"text\"}:"
                        + " kvant does not constrain output to JSON");
            }
            for (String f : new String[] {"tools", "functions"}) {
                JsonNode t = b.array(f);
                if (t != null && !t.isEmpty()) {
                    throw ApiException.unsupported(f, f + " (function calling) are not supported");
                }
            }
            for (String f : new String[] {"tool_choice", "function_call"}) {
                JsonNode c = body.get(f);
                if (c != null && !c.isNull() && !(c.isTextual() && Set.of("none", "auto").contains(c.asText()))) {
                    throw ApiException.unsupported(f, f + " must be \"none\" or \"auto\": function calling is not"
                            + " supported");
                }
            }
            b.bool("parallel_tool_calls");
            b.object("metadata");
            b.bool("store");
            b.string("service_tier");
            b.string("reasoning_effort");
            b.string("verbosity");
            for (String f : new String[] {"prediction", "audio", "web_search_options"}) {
                JsonNode v = body.get(f);
                if (v != null && !v.isNull()) {
                    throw ApiException.unsupported(f, f + " is not supported");
                }
            }
            JsonNode modalities = b.array("modalities");
            if (modalities != null) {
                for (JsonNode m : modalities) {
                    if (!"text".equals(m.asText(null))) {
                        throw ApiException.unsupported("modalities", "only the \"text\" modality is supported");
                    }
                }
            }
        } else {
            JsonNode p = body.get("prompt");
            if (p == null || p.isNull()) {
                throw ApiException.invalid("prompt", "'prompt' is required");
            }
            if (p.isTextual()) {
                prompt = p.asText();
            } else if (p.isArray() && p.size() == 1 && p.get(0).isTextual()) {
                prompt = p.get(0).asText();
            } else if (p.isArray() && p.size() == 1 && p.get(0).isArray()) {
                promptTokens = tokens(p.get(0));
            } else if (p.isArray() && !p.isEmpty() && p.get(0).isIntegralNumber()) {
                promptTokens = tokens(p);
            } else {
                throw ApiException.invalid("prompt", "'prompt' must be a string, one string in an array, or an array of"
                        + " token ids (kvant takes one prompt per request)");
            }
            if (Boolean.TRUE.equals(b.bool("echo"))) {
                throw ApiException.unsupported("echo", "echo is not supported");
            }
            String suffix = b.string("suffix");
            if (suffix != null && !suffix.isEmpty()) {
                throw ApiException.unsupported("suffix", "suffix (insertion) is not supported");
            }
            Integer bestOf = b.integer("best_of", 1, 20);
            if (bestOf != null && bestOf != 1) {
                throw ApiException.unsupported("best_of", "best_of must be 1");
            }
            Integer logprobs = b.integer("logprobs", 0, 5);
            if (logprobs != null) {   // 0 asks for the chosen tokens' own logprobs: not supported either
                throw ApiException.unsupported("logprobs", "logprobs are not supported");
            }
        }
        Double temperature = b.number("temperature", 0, 2);
        Double topP = b.number("top_p", 0, 1);
        Integer topK = b.integer("top_k", 0, Integer.MAX_VALUE);
        Double minP = b.number("min_p", 0, 1);
        Double repeat = b.number("repeat_penalty", 0, 10);
        Integer lastN = b.integer("repeat_last_n", -1, Integer.MAX_VALUE);   // llama.cpp's: -1 the whole context
        if (repeat != null && repeat.floatValue() == 0f) {   // 0, or so small that a float holds 0
            throw ApiException.invalid("repeat_penalty", "'repeat_penalty' must be above 0 (1 is off)");
        }
        Long seed = b.longInteger("seed");
        Boolean stream = b.bool("stream");
        JsonNode options = b.object("stream_options");
        boolean includeUsage = false;
        if (options != null) {
            if (!Boolean.TRUE.equals(stream)) {
                throw ApiException.invalid("stream_options",
                        "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
            }
            known(options, STREAM_OPTIONS, "stream_options.");
            try {
                includeUsage = Boolean.TRUE.equals(new Fields(options).bool("include_usage"));
            } catch (ApiException e) {
                throw ApiException.invalid("stream_options.include_usage",
                        "'stream_options.include_usage' must be a boolean");
            }
        }
        float t = temperature == null ? 1f : temperature.floatValue();
        float p = topP == null ? 1f : topP.floatValue();
        if (p == 0f) {
            // Only the most likely token is left: greedy.
            t = 0f;
            p = 1f;
        }
        return new CompletionRequest(kind, messages, prompt, promptTokens, maxTokens, t, p, topK == null ? 0 : topK,
                minP == null ? 0f : minP.floatValue(), repeat == null ? 1f : repeat.floatValue(),
                lastN == null ? DEFAULT_REPEAT_LAST_N : lastN, frequency == null ? 0f : frequency.floatValue(),
                presence == null ? 0f : presence.floatValue(), seed,
                stops(body.get("stop")), Boolean.TRUE.equals(stream), includeUsage,
                Boolean.TRUE.equals(b.bool("ignore_eos")));
    }

    /** Refuses a field of {@code object} outside {@code names}, as OpenAI refuses an unknown argument. */
    private static void known(JsonNode object, Set<String> names, String prefix) {
        for (Iterator<String> it = object.fieldNames(); it.hasNext(); ) {
            String f = it.next();
            if (!names.contains(f)) {
                throw ApiException.invalid(prefix + f, "Unrecognized request argument supplied: " + prefix + f);
            }
        }
    }

    private static List<ChatMessage> messages(JsonNode node) {
        if (node == null || node.isNull()) {
            throw ApiException.invalid("messages", "'messages' is required");
        }
        if (!node.isArray() || node.isEmpty()) {
            throw ApiException.invalid("messages", "'messages' must be a non-empty array of messages");
        }
        List<ChatMessage> out = new ArrayList<>();
        for (int i = 0; i < node.size(); i++) {
            String where = "messages[" + i + "]";
            JsonNode m = node.get(i);
            if (!m.isObject()) {
                throw ApiException.invalid(where, "'" + where + "' must be an object with a role and content");
            }
            JsonNode roleNode = m.get("role");
            if (roleNode == null || !roleNode.isTextual()) {
                throw ApiException.invalid(where + ".role", "'" + where + ".role' must be a string");
            }
            String role = roleNode.asText();
            if (role.equals("tool") || role.equals("function")) {
                throw ApiException.unsupported(where + ".role", "'" + where + ".role' is '" + role + "': tool and"
                        + " function results are not supported (kvant does no function calling)");
            }
            if (!ROLES.contains(role)) {
                throw ApiException.invalid(where + ".role", "'" + where + ".role' is '" + role + "'; kvant takes "
                        + "system, developer, user and assistant messages (no tools)");
            }
            known(m, MESSAGE_FIELDS, where + ".");
            JsonNode calls = m.get("tool_calls");
            if (calls != null && !calls.isNull()) {
                if (!calls.isArray()) {
                    throw ApiException.invalid(where + ".tool_calls", "'" + where + ".tool_calls' must be an array");
                }
                if (!calls.isEmpty()) {
                    throw ApiException.unsupported(where + ".tool_calls", "tool calls are not supported");
                }
            }
            JsonNode content = m.get("content");
            if ((content == null || content.isNull()) && !role.equals("assistant")) {
                throw ApiException.invalid(where + ".content", "'" + where + ".content' is required for a " + role
                        + " message");
            }
            out.add(new ChatMessage(role.equals("developer") ? "system" : role, content(content, where)));
        }
        return out;
    }

    private static String content(JsonNode c, String where) {
        if (c == null || c.isNull()) {
            return "";
        }
        if (c.isTextual()) {
            return c.asText();
        }
        if (c.isArray()) {
            StringBuilder sb = new StringBuilder();
            for (int j = 0; j < c.size(); j++) {
                JsonNode part = c.get(j);
                String pw = where + ".content[" + j + "]";
                if (!part.isObject() || !"text".equals(part.path("type").asText(null))) {
                    throw ApiException.unsupported(pw, "'" + pw + "' must be a {\"type\": \"text\", \"text\": ...}"
                            + " part; kvant takes text only");
                }
                JsonNode text = part.get("text");
                if (text == null || !text.isTextual()) {
                    throw ApiException.invalid(pw + ".text", "'" + pw + ".text' must be a string");
                }
                sb.append(j == 0 ? "" : "\n").append(text.asText());   // one part a line, as vLLM and llama.cpp
            }
            return sb.toString();
        }
        throw ApiException.invalid(where + ".content", "'" + where + ".content' must be a string or an array of text"
                + " parts");
    }

    private static int[] tokens(JsonNode array) {
        if (array.isEmpty()) {
            throw ApiException.invalid("prompt", "the prompt has no tokens");
        }
        int[] ids = new int[array.size()];
        for (int i = 0; i < ids.length; i++) {
            JsonNode t = array.get(i);
            if (!t.isIntegralNumber() || !t.canConvertToInt()) {
                throw ApiException.invalid("prompt", "'prompt[" + i + "]' must be a token id (an integer), got " + t);
            }
            ids[i] = t.asInt();
        }
        return ids;
    }

    static final int MAX_STOP_CHARS = 256;

    private static List<String> stops(JsonNode s) {
        if (s == null || s.isNull()) {
            return List.of();
        }
        List<String> out = new ArrayList<>();
        if (s.isTextual()) {
            out.add(s.asText());
        } else if (s.isArray() && s.size() <= 4) {
            for (JsonNode e : s) {
                if (!e.isTextual()) {
                    throw ApiException.invalid("stop", "'stop' must be a string or an array of up to 4 strings");
                }
                out.add(e.asText());
            }
        } else {
            throw ApiException.invalid("stop", "'stop' must be a string or an array of up to 4 strings");
        }
        if (out.stream().anyMatch(String::isEmpty)) {
            throw ApiException.invalid("stop", "stop strings must not be empty");
        }
        // the held-back text is checked against every suffix of a stop string on each token: keep that short
        if (out.stream().anyMatch(x -> x.length() > MAX_STOP_CHARS)) {
            throw ApiException.invalid("stop", "stop strings must be at most " + MAX_STOP_CHARS + " characters");
        }
        return List.copyOf(out);
    }

    /** Typed reads of optional fields; null (absent or JSON null) means "not given". */
    private record Fields(JsonNode node) {
        private JsonNode get(String f) {
            JsonNode v = node.get(f);
            return v == null || v.isNull() ? null : v;
        }

        private static ApiException wrongType(String f, String what, JsonNode v) {
            return ApiException.invalid(f, "'" + f + "' must be " + what + ", got " + describe(v));
        }

        String string(String f) {
            JsonNode v = get(f);
            if (v == null) {
                return null;
            }
            if (!v.isTextual()) {
                throw wrongType(f, "a string", v);
            }
            return v.asText();
        }

        Boolean bool(String f) {
            JsonNode v = get(f);
            if (v == null) {
                return null;
            }
            if (!v.isBoolean()) {
                throw wrongType(f, "a boolean", v);
            }
            return v.asBoolean();
        }

        Double number(String f, double min, double max) {
            JsonNode v = get(f);
            if (v == null) {
                return null;
            }
            if (!v.isNumber()) {
                throw wrongType(f, "a number between " + fmt(min) + " and " + fmt(max), v);
            }
            double d = v.asDouble();
            if (!(d >= min && d <= max)) {
                throw ApiException.invalid(f, "'" + f + "' must be between " + fmt(min) + " and " + fmt(max)
                        + ", got " + v);
            }
            return d;
        }

        Integer integer(String f, int min, int max) {
            JsonNode v = get(f);
            if (v == null) {
                return null;
            }
            if (!v.isIntegralNumber() || !v.canConvertToInt()) {
                throw wrongType(f, "an integer", v);
            }
            int i = v.asInt();
            if (i < min || i > max) {
                throw ApiException.invalid(f, "'" + f + "' must be at least " + min
                        + (max < Integer.MAX_VALUE ? " and at most " + max : "") + ", got " + i);
            }
            return i;
        }

        Long longInteger(String f) {
            JsonNode v = get(f);
            if (v == null) {
                return null;
            }
            if (!v.isIntegralNumber() || !v.canConvertToLong()) {
                throw wrongType(f, "an integer", v);
            }
            return v.asLong();
        }

        JsonNode object(String f) {
            JsonNode v = get(f);
            if (v != null && !v.isObject()) {
                throw wrongType(f, "an object", v);
            }
            return v;
        }

        JsonNode array(String f) {
            JsonNode v = get(f);
            if (v != null && !v.isArray()) {
                throw wrongType(f, "an array", v);
            }
            return v;
        }

        private static String fmt(double d) {
            return d == Math.rint(d) ? String.valueOf((long) d) : String.valueOf(d);
        }

        private static String describe(JsonNode v) {
            String type = switch (v.getNodeType()) {
                case STRING -> "a string";
                case NUMBER -> "a number";
                case BOOLEAN -> "a boolean";
                case ARRAY -> "an array";
                case OBJECT -> "an object";
                default -> v.getNodeType().name().toLowerCase(java.util.Locale.ROOT);
            };
            String text = v.toString();
            return type + " (" + (text.length() > 40 ? text.substring(0, 40) + "..." : text) + ")";
        }
    }
}
