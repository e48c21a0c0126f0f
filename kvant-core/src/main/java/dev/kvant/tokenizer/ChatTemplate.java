package dev.kvant.tokenizer;

import java.time.LocalDate;
import java.time.ZoneOffset;
import java.util.List;
import java.util.stream.Collectors;

/**
 * The prompt formats of common chat models, built in, and a model's chat template as one of them.
 *
 * <p>A GGUF file carries its chat format as a Jinja program ({@code tokenizer.chat_template}). kvant does not run
 * Jinja: kvant-core depends on nothing but the JDK, and no maintained Java Jinja engine exists without a large
 * transitive dependency tree. Instead {@link #detect} recognises the format by markers in the template text and
 * renders it with plain code here, as llama.cpp's built-in templates do; a user can name a format to override.
 * Each format follows the model family's published template (model card / HF {@code tokenizer_config.json}); where
 * a family has several revisions the one followed is named below.
 *
 * <p>A format is one of the constants here. What a model's template adds to its format, the default system prompt
 * of a Mistral Small 3 template, is read from the template's text by {@link #detect}, which then gives a template of
 * its own; a format chosen by name has no template text and renders the format alone.
 *
 * <p>Conversations some published templates refuse (Llama 2's, Mistral's and Gemma's raise on roles that do not
 * alternate user/assistant) are rendered anyway, turn by turn, as llama.cpp's built-in templates render them; only a
 * system message no user message follows is refused where the format folds it into that message.
 *
 * <p>The rendered text never starts with BOS: the tokenizer adds it ({@code encode(prompt, true, true)}), and a BOS
 * in the text as well would give two. Markers inside the conversation ({@code <|eot_id|>}, {@code </s>}, ...) are
 * written as text and become control tokens only when the prompt is encoded with {@code parseSpecial = true}.
 */
public final class ChatTemplate {
    private static final String QWEN2_SYSTEM = "You are a helpful assistant.";
    private static final String QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

    /**
     * Llama 3: {@code <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>}, content trimmed; no system turn
     * of its own.
     */
    public static final ChatTemplate LLAMA3 = new ChatTemplate(Format.LLAMA3, "llama3");
    /**
     * Llama 3.1 / 3.3 (templates that write "Cutting Knowledge Date"): as {@link #LLAMA3}, but the conversation always
     * opens with a system turn "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" followed by the
     * first message's text when that is a system message (trimmed); later system messages are turns of their own.
     */
    public static final ChatTemplate LLAMA31 = new ChatTemplate(Format.LLAMA31, "llama3.1");
    /**
     * Llama 3.2 (a 3.1 template that asks for {@code strftime_now}): as {@link #LLAMA31} with today's date (UTC,
     * "01 Dec 2026") where 3.1 writes 26 Jul 2024.
     */
    public static final ChatTemplate LLAMA32 = new ChatTemplate(Format.LLAMA32, "llama3.2");
    /**
     * Llama 2 chat (Meta's HF template): {@code [INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer </s><s>[INST] ...},
     * user and answer trimmed; the system prompt goes inside the first user turn.
     */
    public static final ChatTemplate LLAMA2 = new ChatTemplate(Format.LLAMA2, "llama2");
    /** ChatML (Yi, many fine-tunes): {@code <|im_start|>role\ncontent<|im_end|>\n}; no default system prompt. */
    public static final ChatTemplate CHATML = new ChatTemplate(Format.CHATML, "chatml");
    /** Qwen2: ChatML, opened by the system prompt "You are a helpful assistant." when the first message is no system. */
    public static final ChatTemplate QWEN2 = new ChatTemplate(Format.QWEN2, "qwen2", QWEN2_SYSTEM);
    /** Qwen2.5: as {@link #QWEN2}, its default system prompt naming Qwen. */
    public static final ChatTemplate QWEN25 = new ChatTemplate(Format.QWEN25, "qwen2.5", QWEN25_SYSTEM);
    /**
     * Qwen3: ChatML without a default system prompt; an answer given before the last user message keeps only its
     * text after {@code </think>} (its reasoning is not sent back), an answer after it has its reasoning written as
     * {@code <think>\nreasoning\n</think>\n\n} before its text (Qwen3's template with thinking on).
     */
    public static final ChatTemplate QWEN3 = new ChatTemplate(Format.QWEN3, "qwen3");
    /**
     * Qwen's thinking-only templates (QwQ, Qwen3-*-Thinking-2507): as {@link #QWEN3}, the generation prompt opening the
     * answer's reasoning, {@code <|im_start|>assistant\n<think>\n}.
     */
    public static final ChatTemplate QWEN3_THINKING = new ChatTemplate(Format.QWEN3_THINKING, "qwen3-thinking");
    /**
     * Mistral 7B Instruct v0.1 / Mixtral 8x7B: {@code [INST] user [/INST]answer</s>[INST] ...}; a system prompt, which
     * those templates lack, is put before the first user message with a blank line between (as later Mistral
     * templates and llama.cpp do).
     */
    public static final ChatTemplate MISTRAL = new ChatTemplate(Format.MISTRAL, "mistral");
    /**
     * The current template of Mistral 7B Instruct v0.1 / v0.2 and Mixtral 8x7B: as {@link #MISTRAL}, the answer
     * written after a space ({@code [/INST] answer</s>}) and the system message (the first message only) put before
     * the first user message. (Its {@code " [INST]"} is written without the leading space: the tokenizer gives the
     * word-start mark after BOS and {@code </s>} by itself, and the space would make it two.)
     */
    public static final ChatTemplate MISTRAL_V1 = new ChatTemplate(Format.MISTRAL_V1, "mistral-v1");
    /**
     * Mistral's v3 template (Mistral 7B Instruct v0.3, Mixtral 8x22B): {@code [INST] user[/INST] answer</s>}, the
     * answer trimmed; a system prompt goes before the last user message with a blank line between.
     */
    public static final ChatTemplate MISTRAL_V3 = new ChatTemplate(Format.MISTRAL_V3, "mistral-v3");
    /**
     * Mistral's v3 Tekken template (Mistral Nemo, Ministral): {@code [INST]user[/INST]answer</s>}, no spaces; a
     * system prompt goes before the last user message with a blank line between.
     */
    public static final ChatTemplate MISTRAL_V3_TEKKEN = new ChatTemplate(Format.MISTRAL_V3_TEKKEN,
            "mistral-v3-tekken");
    /**
     * Mistral's v7 template (Mistral Large 2411, Pixtral Large): {@code [SYSTEM_PROMPT] system[/SYSTEM_PROMPT]}, then
     * {@code [INST] user[/INST] answer</s>}; system prompts stay where they are.
     */
    public static final ChatTemplate MISTRAL_V7 = new ChatTemplate(Format.MISTRAL_V7, "mistral-v7");
    /**
     * Mistral's v7 Tekken template (Mistral Small 3.x): as {@link #MISTRAL_V7} without the spaces. Mistral Small 3's
     * template opens a conversation whose first message is no system message with its own default system prompt,
     * {@code [SYSTEM_PROMPT]default[/SYSTEM_PROMPT]}; {@link #detect} takes that text from the template (the
     * {@code default_system_message} it sets, today's date where it asks {@code strftime_now} for it, in UTC), and
     * the template it gives writes it. This format by name writes none, as llama.cpp's built-in one.
     */
    public static final ChatTemplate MISTRAL_V7_TEKKEN = new ChatTemplate(Format.MISTRAL_V7_TEKKEN,
            "mistral-v7-tekken");
    /**
     * Gemma: {@code <start_of_turn>user\ncontent<end_of_turn>\n}, the assistant's role written {@code model}, content
     * trimmed; a system prompt goes before the first user message with a blank line between (Gemma 2/3 templates).
     */
    public static final ChatTemplate GEMMA = new ChatTemplate(Format.GEMMA, "gemma");
    /** No markers: the contents concatenated, for base models, which complete text rather than chat. */
    public static final ChatTemplate RAW = new ChatTemplate(Format.RAW, "raw");

    private static final List<ChatTemplate> BUILT_IN = List.of(LLAMA3, LLAMA31, LLAMA32, LLAMA2, CHATML, QWEN2, QWEN25,
            QWEN3, QWEN3_THINKING, MISTRAL, MISTRAL_V1, MISTRAL_V3, MISTRAL_V3_TEKKEN, MISTRAL_V7, MISTRAL_V7_TEKKEN,
            GEMMA, RAW);

    /**
     * The built-in formats, what each template renders (the constants of the same names say how); a model's template
     * is one of them and what its text adds.
     */
    public enum Format {
        LLAMA3, LLAMA31, LLAMA32, LLAMA2, CHATML, QWEN2, QWEN25, QWEN3, QWEN3_THINKING, MISTRAL, MISTRAL_V1, MISTRAL_V3,
        MISTRAL_V3_TEKKEN, MISTRAL_V7, MISTRAL_V7_TEKKEN, GEMMA, RAW
    }

    private final Format format;
    private final String templateName;
    /** The system prompt a conversation that does not open with one gets, or null. */
    private final JinjaStrings.Value defaultSystem;

    private ChatTemplate(Format format, String templateName) {
        this(format, templateName, (JinjaStrings.Value) null);
    }

    private ChatTemplate(Format format, String templateName, String defaultSystem) {
        this(format, templateName, JinjaStrings.Value.of(defaultSystem));
    }

    private ChatTemplate(Format format, String templateName, JinjaStrings.Value defaultSystem) {
        this.format = format;
        this.templateName = templateName;
        this.defaultSystem = defaultSystem;
    }

    /** The built-in formats, in the order their names are listed. */
    public static List<ChatTemplate> builtIn() {
        return BUILT_IN;
    }

    /** The format this template renders. */
    public Format format() {
        return format;
    }

    /** The name users select the format by. */
    public String templateName() {
        return templateName;
    }

    @Override
    public String toString() {
        return templateName;
    }

    /**
     * The format to use: the one named by {@code nameOverrideOrNull} if given, otherwise the one whose markers the
     * model's template shows, with what the template adds to it (Mistral Small 3's default system prompt, see
     * {@link #MISTRAL_V7_TEKKEN}); {@link #RAW} when the model has no template.
     *
     * @throws IllegalArgumentException for an unknown name, or a template of no known format, listing the names
     */
    public static ChatTemplate detect(String jinjaTemplateOrNull, String nameOverrideOrNull) {
        if (nameOverrideOrNull != null) {
            return named(nameOverrideOrNull);
        }
        String t = jinjaTemplateOrNull;
        if (t == null || t.isBlank()) {
            return RAW;
        }
        if (t.contains("<|start_header_id|>")) {
            if (t.contains("Cutting Knowledge Date")) {
                return t.contains("strftime_now") ? LLAMA32 : LLAMA31;
            }
            return LLAMA3;
        }
        if (t.contains("<|im_start|>")) {
            if (t.contains("</think>")) {
                // a generation prompt that opens the reasoning itself (QwQ, the Thinking-2507 models)
                return t.contains("<|im_start|>assistant\\n<think>\\n") ? QWEN3_THINKING : QWEN3;
            }
            if (t.contains(QWEN25_SYSTEM)) {
                return QWEN25;
            }
            if (t.contains("<|im_start|>system\\n" + QWEN2_SYSTEM + "<|im_end|>")) {
                return QWEN2;
            }
            return CHATML;
        }
        if (t.contains("<start_of_turn>")) {
            return GEMMA;
        }
        if (t.contains("[SYSTEM_PROMPT]")) {
            return t.contains("[SYSTEM_PROMPT] ") ? MISTRAL_V7 : MISTRAL_V7_TEKKEN.withDefaultSystemOf(t);
        }
        if (t.contains("[INST]")) {
            if (t.contains("<<SYS>>")) {
                return LLAMA2;
            }
            // Mistral's own templates (as llama.cpp tells them apart): tools or a system message put into a turn
            if (t.contains("[AVAILABLE_TOOLS]") || t.contains("' [INST] ' + system_message")) {
                if (t.contains(" [INST]")) {
                    return MISTRAL_V1;
                }
                return t.contains("\"[INST]\"") || t.contains("'[INST]'") ? MISTRAL_V3_TEKKEN : MISTRAL_V3;
            }
            return MISTRAL;
        }
        String head = t.length() > 80 ? t.substring(0, 80) + "..." : t;
        throw new IllegalArgumentException("the model's chat template (tokenizer.chat_template, starting '"
                + head.replace("\n", "\\n") + "') is none of the built-in formats; choose one by name: " + names());
    }

    /**
     * The format with this name.
     *
     * @throws IllegalArgumentException listing the names
     */
    public static ChatTemplate named(String name) {
        for (ChatTemplate c : BUILT_IN) {
            if (c.templateName.equals(name)) {
                return c;
            }
        }
        throw new IllegalArgumentException("unknown chat template '" + name + "'; built-in templates: " + names());
    }

    private static String names() {
        return BUILT_IN.stream().map(ChatTemplate::templateName).collect(Collectors.joining(", "));
    }

    /**
     * The prompt text for a conversation.
     *
     * @param addGenerationPrompt end with the opening of an assistant turn, for the model to continue (formats whose
     *                            user turn already ends in the cue, llama2 and the mistral ones, add nothing)
     * @throws IllegalArgumentException for a role the format cannot express
     */
    public String render(List<ChatMessage> messages, boolean addGenerationPrompt) {
        return renderMarked(messages, addGenerationPrompt).text();
    }

    /**
     * A rendered conversation: its text, and the ranges of it that came from the messages' contents, [start, end)
     * pairs in order. A tokenizer reads control-token texts as control tokens only outside those ranges, so a
     * message cannot write a turn of its own ({@link Tokenizer#encode(String, boolean, boolean, int[])}).
     */
    public record Rendered(String text, int[] contentRanges) {
    }

    /** {@link #render}, with the ranges of the text that came from the messages ({@link Rendered}). */
    public Rendered renderMarked(List<ChatMessage> messages, boolean addGenerationPrompt) {
        return renderMarked(messages, addGenerationPrompt, LocalDate.now(ZoneOffset.UTC));
    }

    /** {@link #renderMarked(List, boolean)} on the given day, for the templates that write today's date. */
    Rendered renderMarked(List<ChatMessage> messages, boolean addGenerationPrompt, LocalDate today) {
        Out o = new Out();
        boolean noSystemFirst = messages.isEmpty() || !messages.get(0).role().equals("system");
        switch (format) {
            case LLAMA3, LLAMA31, LLAMA32 -> {
                List<ChatMessage> rest = messages;
                if (format != Format.LLAMA3) {
                    String system = "";
                    if (!messages.isEmpty() && messages.get(0).role().equals("system")) {
                        system = strip(messages.get(0).content());
                        rest = messages.subList(1, messages.size());
                    }
                    o.t("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: ")
                            .t(format == Format.LLAMA32 ? JinjaStrings.strftime("%d %b %Y", today) : "26 Jul 2024")
                            .t("\n\n").c(system).t("<|eot_id|>");
                }
                for (ChatMessage m : rest) {
                    o.t("<|start_header_id|>").c(m.role()).t("<|end_header_id|>\n\n").c(strip(m.content()))
                            .t("<|eot_id|>");
                }
                if (addGenerationPrompt) {
                    o.t("<|start_header_id|>assistant<|end_header_id|>\n\n");
                }
            }
            case CHATML, QWEN2, QWEN25, QWEN3, QWEN3_THINKING -> {
                if (defaultSystem != null && noSystemFirst) {
                    o.t("<|im_start|>system\n").t(defaultSystem.on(today)).t("<|im_end|>\n");
                }
                int lastUser = -1;
                for (int i = 0; i < messages.size(); i++) {
                    if (messages.get(i).role().equals("user")) {
                        lastUser = i;
                    }
                }
                for (int i = 0; i < messages.size(); i++) {
                    ChatMessage m = messages.get(i);
                    o.t("<|im_start|>").c(m.role()).t("\n");
                    if ((format == Format.QWEN3 || format == Format.QWEN3_THINKING) && m.role().equals("assistant")) {
                        qwen3Answer(o, m.content(), i > lastUser, i == messages.size() - 1);
                    } else {
                        o.c(m.content());
                    }
                    o.t("<|im_end|>\n");
                }
                if (addGenerationPrompt) {
                    o.t("<|im_start|>assistant\n").t(format == Format.QWEN3_THINKING ? "<think>\n" : "");
                }
            }
            case LLAMA2 -> {
                String system = null;
                boolean afterAnswer = false;   // a turn after an answer's </s> opens with <s> (the first has BOS)
                for (ChatMessage m : messages) {
                    switch (role(m)) {
                        case "system" -> system = joinSystem(system, m.content());
                        case "user" -> {
                            o.t(afterAnswer ? "<s>" : "").t("[INST] ");
                            if (system != null) {
                                // "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content, stripped as one string (it
                                // starts with "<<SYS>>": only its end can be blank)
                                int from = o.length();
                                o.t("<<SYS>>\n").c(system).t("\n<</SYS>>\n\n").c(m.content()).stripTrailing(from);
                                system = null;
                            } else {
                                o.c(strip(m.content()));
                            }
                            o.t(" [/INST]");
                            afterAnswer = false;
                        }
                        default -> {
                            o.t(" ").c(strip(m.content())).t(" </s>");
                            afterAnswer = true;
                        }
                    }
                }
                checkSystemUsed(system != null);
            }
            case MISTRAL, MISTRAL_V1 -> {
                String system = null;
                for (ChatMessage m : messages) {
                    switch (role(m)) {
                        case "system" -> system = joinSystem(system, m.content());
                        case "user" -> {
                            o.t("[INST] ");
                            if (system != null) {
                                o.c(system).t("\n\n");
                            }
                            o.c(m.content()).t(" [/INST]");
                            system = null;
                        }
                        // an answer read back from SentencePiece decoding starts with its first word's space,
                        // which the template's own separator already is: one space, not two
                        default -> {
                            boolean v1 = format == Format.MISTRAL_V1;
                            o.t(v1 ? " " : "").c(v1 ? stripLeading(m.content(), " ") : m.content()).t("</s>");
                        }
                    }
                }
                checkSystemUsed(system != null);
            }
            case MISTRAL_V3, MISTRAL_V3_TEKKEN -> {
                boolean tekken = format == Format.MISTRAL_V3_TEKKEN;
                List<String> systems = new java.util.ArrayList<>();
                int lastUser = -1;
                for (int i = 0; i < messages.size(); i++) {
                    String role = role(messages.get(i));
                    if (role.equals("system")) {
                        systems.add(messages.get(i).content());
                    } else if (role.equals("user")) {
                        lastUser = i;
                    }
                }
                checkSystemUsed(!systems.isEmpty() && lastUser < 0);
                for (int i = 0; i < messages.size(); i++) {
                    ChatMessage m = messages.get(i);
                    switch (role(m)) {
                        case "system" -> { }
                        case "user" -> {
                            o.t(tekken ? "[INST]" : "[INST] ");
                            if (i == lastUser) {
                                for (String sys : systems) {
                                    o.c(sys).t("\n\n");
                                }
                            }
                            o.c(m.content()).t("[/INST]");
                        }
                        default -> {
                            if (tekken) {
                                o.c(m.content());
                            } else {
                                o.t(" ").c(strip(m.content()));
                            }
                            o.t("</s>");
                        }
                    }
                }
            }
            case MISTRAL_V7, MISTRAL_V7_TEKKEN -> {
                String space = format == Format.MISTRAL_V7 ? " " : "";
                if (defaultSystem != null && noSystemFirst) {
                    o.t("[SYSTEM_PROMPT]").t(space).t(defaultSystem.on(today)).t("[/SYSTEM_PROMPT]");
                }
                for (ChatMessage m : messages) {
                    switch (role(m)) {
                        case "system" -> o.t("[SYSTEM_PROMPT]").t(space).c(m.content()).t("[/SYSTEM_PROMPT]");
                        case "user" -> o.t("[INST]").t(space).c(m.content()).t("[/INST]");
                        // as V1: the separator space is the answer's leading one
                        default -> o.t(space).c(space.isEmpty() ? m.content() : stripLeading(m.content(), " "))
                                .t("</s>");
                    }
                }
            }
            case GEMMA -> {
                String system = null;
                for (ChatMessage m : messages) {
                    String role = role(m);
                    if (role.equals("system")) {
                        // Gemma 3 writes the system text as given (Gemma 2's template refuses a system message)
                        system = joinSystem(system, m.content());
                        continue;
                    }
                    o.t("<start_of_turn>").t(role.equals("assistant") ? "model" : "user").t("\n");
                    if (role.equals("user") && system != null) {
                        o.c(system).t("\n\n");
                        system = null;
                    }
                    o.c(strip(m.content())).t("<end_of_turn>\n");
                }
                checkSystemUsed(system != null);
                if (addGenerationPrompt) {
                    o.t("<start_of_turn>model\n");
                }
            }
            case RAW -> {
                for (ChatMessage m : messages) {
                    o.c(m.content());
                }
            }
        }
        return o.done();
    }

    /**
     * Qwen3's answer: before the last user message only the text after its reasoning ({@code </think>}); after it,
     * the reasoning (the text between {@code <think>} and {@code </think>}, or none) in a think block before the text,
     * when there is reasoning or the answer is the conversation's last message.
     */
    private static void qwen3Answer(Out o, String content, boolean afterLastUser, boolean last) {
        String reasoning = "";
        String text = content;
        int end = content.lastIndexOf("</think>");
        if (end >= 0) {
            text = stripLeading(content.substring(end + "</think>".length()), "\n");
            String before = stripTrailing(content.substring(0, content.indexOf("</think>")), "\n");
            int open = before.lastIndexOf("<think>");
            reasoning = stripLeading(open >= 0 ? before.substring(open + "<think>".length()) : before, "\n");
        }
        if (afterLastUser && (last || !reasoning.isEmpty())) {
            o.t("<think>\n").c(stripTrailing(stripLeading(reasoning, "\n"), "\n")).t("\n</think>\n\n")
                    .c(stripLeading(text, "\n"));
        } else {
            o.c(text);
        }
    }

    private static String stripLeading(String s, String chars) {
        int i = 0;
        while (i < s.length() && chars.indexOf(s.charAt(i)) >= 0) {
            i++;
        }
        return s.substring(i);
    }

    private static String stripTrailing(String s, String chars) {
        int e = s.length();
        while (e > 0 && chars.indexOf(s.charAt(e - 1)) >= 0) {
            e--;
        }
        return s.substring(0, e);
    }

    /** Python's str.strip() (the templates' {@code trim}): Java's blanks and also U+0085, U+00A0, U+2007, U+202F. */
    static String strip(String s) {
        int b = 0, e = s.length();
        while (b < e && isPythonSpace(s.charAt(b))) {
            b++;
        }
        while (e > b && isPythonSpace(s.charAt(e - 1))) {
            e--;
        }
        return s.substring(b, e);
    }

    private static boolean isPythonSpace(char c) {
        return Character.isWhitespace(c) || c == '\u0085' || c == '\u00a0' || c == '\u2007' || c == '\u202f';
    }

    /**
     * This format with the default system prompt the model's template sets ({@code default_system_message}, read by
     * {@link JinjaStrings}); the format alone when it sets none, or one kvant cannot read (with a warning: the prompt
     * then lacks what the template would write).
     */
    private ChatTemplate withDefaultSystemOf(String jinja) {
        JinjaStrings.Value system;
        try {
            system = JinjaStrings.find(jinja, "default_system_message");
        } catch (IllegalArgumentException e) {
            System.getLogger(ChatTemplate.class.getName()).log(System.Logger.Level.WARNING, "chat template '"
                    + templateName + "': the model's default system prompt is left out, since " + e.getMessage());
            return this;
        }
        return system == null ? this : new ChatTemplate(format, templateName, system);
    }

    /**
     * The system text of formats that fold it into the next user turn: several system (or developer) messages before
     * it are all kept, a blank line between them (one used to replace the one before).
     */
    private static String joinSystem(String before, String content) {
        return before == null ? content : before + "\n\n" + content;
    }

    /** The text being rendered, with the ranges of it that are the messages' own. */
    private static final class Out {
        private final StringBuilder sb = new StringBuilder();
        private final List<Integer> ranges = new java.util.ArrayList<>();

        /** The format's own text. */
        Out t(String text) {
            sb.append(text);
            return this;
        }

        /** Text from a message. */
        Out c(String text) {
            if (!text.isEmpty()) {
                int n = ranges.size();
                if (n > 0 && ranges.get(n - 1) == sb.length()) {
                    ranges.set(n - 1, sb.length() + text.length());   // one range with the one before
                } else {
                    ranges.add(sb.length());
                    ranges.add(sb.length() + text.length());
                }
                sb.append(text);
            }
            return this;
        }

        int length() {
            return sb.length();
        }

        /** Drops the blanks (Python's) at the end of the text from {@code from} on, as strip does. */
        Out stripTrailing(int from) {
            int end = sb.length();
            while (end > from && isPythonSpace(sb.charAt(end - 1))) {
                end--;
            }
            sb.setLength(end);
            for (int i = ranges.size() - 2; i >= 0; i -= 2) {
                if (ranges.get(i) >= end) {
                    ranges.remove(i + 1);
                    ranges.remove(i);
                } else if (ranges.get(i + 1) > end) {
                    ranges.set(i + 1, end);
                }
            }
            return this;
        }

        Rendered done() {
            return new Rendered(sb.toString(), ranges.stream().mapToInt(Integer::intValue).toArray());
        }
    }

    /**
     * Formats that fold the system text into a user message refuse a conversation whose system message no user
     * message follows (it would vanish from the prompt).
     */
    private void checkSystemUsed(boolean leftOver) {
        if (leftOver) {
            throw new IllegalArgumentException("chat template '" + templateName + "' puts the system message into the"
                    + " user message after it, and this conversation has none");
        }
    }

    /** The role of a message in a format that knows only system, user and assistant. */
    private String role(ChatMessage m) {
        return switch (m.role()) {
            case "system", "user", "assistant" -> m.role();
            default -> throw new IllegalArgumentException("chat template '" + templateName + "' has no role '" + m.role()
                    + "'; it knows system, user and assistant");
        };
    }
}
