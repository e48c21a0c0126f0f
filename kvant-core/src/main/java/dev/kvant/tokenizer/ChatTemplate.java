package dev.kvant.tokenizer;

import java.util.Arrays;
import java.util.List;
import java.util.stream.Collectors;

/**
 * The prompt formats of common chat models, built in.
 *
 * <p>A GGUF file carries its chat format as a Jinja program ({@code tokenizer.chat_template}). kvant does not run
 * Jinja: kvant-core depends on nothing but the JDK, and no maintained Java Jinja engine exists without a large
 * transitive dependency tree. Instead {@link #detect} recognises the format by markers in the template text and
 * renders it with plain code here, as llama.cpp's built-in templates do; a user can name a format to override.
 * Each format follows the model family's published template (model card / HF {@code tokenizer_config.json}); where
 * a family has several revisions the one followed is named below.
 *
 * <p>The rendered text never starts with BOS: the tokenizer adds it ({@code encode(prompt, true, true)}), and a BOS
 * in the text as well would give two. Markers inside the conversation ({@code <|eot_id|>}, {@code </s>}, ...) are
 * written as text and become control tokens only when the prompt is encoded with {@code parseSpecial = true}.
 */
public enum ChatTemplate {
    /**
     * Llama 3 / 3.1 / 3.2: {@code <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>}, content trimmed.
     * No default system prompt (3.1's "Cutting Knowledge Date" header) is added.
     */
    LLAMA3("llama3"),
    /**
     * Llama 2 chat (Meta's HF template): {@code [INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer </s><s>[INST] ...},
     * user and answer trimmed; the system prompt goes inside the first user turn.
     */
    LLAMA2("llama2"),
    /** ChatML (Qwen, Yi, many fine-tunes): {@code <|im_start|>role\ncontent<|im_end|>\n}; no default system prompt. */
    CHATML("chatml"),
    /**
     * Mistral 7B Instruct v0.1 / Mixtral 8x7B: {@code [INST] user [/INST]answer</s>[INST] ...}; a system prompt, which
     * those templates lack, is put before the first user message with a blank line between (as later Mistral
     * templates and llama.cpp do).
     */
    MISTRAL("mistral"),
    /**
     * Mistral's v3 template (Mistral 7B Instruct v0.3, Mixtral 8x22B): {@code [INST] user[/INST] answer</s>}, the
     * answer trimmed; a system prompt goes before the last user message with a blank line between.
     */
    MISTRAL_V3("mistral-v3"),
    /**
     * Mistral's v3 Tekken template (Mistral Nemo, Ministral): {@code [INST]user[/INST]answer</s>}, no spaces; a
     * system prompt goes before the last user message with a blank line between.
     */
    MISTRAL_V3_TEKKEN("mistral-v3-tekken"),
    /**
     * Mistral's v7 template (Mistral Large 2411, Pixtral Large): {@code [SYSTEM_PROMPT] system[/SYSTEM_PROMPT]}, then
     * {@code [INST] user[/INST] answer</s>}; system prompts stay where they are.
     */
    MISTRAL_V7("mistral-v7"),
    /** Mistral's v7 Tekken template (Mistral Small 3.x): as {@link #MISTRAL_V7} without the spaces. */
    MISTRAL_V7_TEKKEN("mistral-v7-tekken"),
    /**
     * Gemma: {@code <start_of_turn>user\ncontent<end_of_turn>\n}, the assistant's role written {@code model}, content
     * trimmed; a system prompt goes before the first user message with a blank line between (Gemma 2/3 templates).
     */
    GEMMA("gemma"),
    /** No markers: the contents concatenated, for base models, which complete text rather than chat. */
    RAW("raw");

    private final String templateName;

    ChatTemplate(String templateName) {
        this.templateName = templateName;
    }

    /** The name users select the format by. */
    public String templateName() {
        return templateName;
    }

    /**
     * The format to use: the one named by {@code nameOverrideOrNull} if given, otherwise the one whose markers the
     * model's template shows; {@link #RAW} when the model has no template.
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
            return LLAMA3;
        }
        if (t.contains("<|im_start|>")) {
            return CHATML;
        }
        if (t.contains("<start_of_turn>")) {
            return GEMMA;
        }
        if (t.contains("[SYSTEM_PROMPT]")) {
            return t.contains("[SYSTEM_PROMPT] ") ? MISTRAL_V7 : MISTRAL_V7_TEKKEN;
        }
        if (t.contains("[INST]")) {
            if (t.contains("<<SYS>>")) {
                return LLAMA2;
            }
            // Mistral's own templates (as llama.cpp tells them apart): tools or a system message put into a turn
            if (t.contains("[AVAILABLE_TOOLS]") || t.contains("' [INST] ' + system_message")) {
                if (t.contains(" [INST]")) {
                    return MISTRAL;
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
        for (ChatTemplate c : values()) {
            if (c.templateName.equals(name)) {
                return c;
            }
        }
        throw new IllegalArgumentException("unknown chat template '" + name + "'; built-in templates: " + names());
    }

    private static String names() {
        return Arrays.stream(values()).map(ChatTemplate::templateName).collect(Collectors.joining(", "));
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
        Out o = new Out();
        switch (this) {
            case LLAMA3 -> {
                for (ChatMessage m : messages) {
                    o.t("<|start_header_id|>").c(m.role()).t("<|end_header_id|>\n\n").c(m.content().strip())
                            .t("<|eot_id|>");
                }
                if (addGenerationPrompt) {
                    o.t("<|start_header_id|>assistant<|end_header_id|>\n\n");
                }
            }
            case CHATML -> {
                for (ChatMessage m : messages) {
                    o.t("<|im_start|>").c(m.role()).t("\n").c(m.content()).t("<|im_end|>\n");
                }
                if (addGenerationPrompt) {
                    o.t("<|im_start|>assistant\n");
                }
            }
            case LLAMA2 -> {
                String system = null;
                boolean firstUser = true;
                for (ChatMessage m : messages) {
                    switch (role(m)) {
                        case "system" -> system = joinSystem(system, m.content());
                        case "user" -> {
                            o.t(firstUser ? "" : "<s>").t("[INST] ");
                            if (system != null) {
                                // "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content, stripped as one string (it
                                // starts with "<<SYS>>": only its end can be blank)
                                int from = o.length();
                                o.t("<<SYS>>\n").c(system).t("\n<</SYS>>\n\n").c(m.content()).stripTrailing(from);
                                system = null;
                            } else {
                                o.c(m.content().strip());
                            }
                            o.t(" [/INST]");
                            firstUser = false;
                        }
                        default -> o.t(" ").c(m.content().strip()).t(" </s>");
                    }
                }
                checkSystemUsed(system != null);
            }
            case MISTRAL -> {
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
                        default -> o.c(m.content()).t("</s>");
                    }
                }
                checkSystemUsed(system != null);
            }
            case MISTRAL_V3, MISTRAL_V3_TEKKEN -> {
                boolean tekken = this == MISTRAL_V3_TEKKEN;
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
                                o.t(" ").c(m.content().strip());
                            }
                            o.t("</s>");
                        }
                    }
                }
            }
            case MISTRAL_V7, MISTRAL_V7_TEKKEN -> {
                String space = this == MISTRAL_V7 ? " " : "";
                for (ChatMessage m : messages) {
                    switch (role(m)) {
                        case "system" -> o.t("[SYSTEM_PROMPT]").t(space).c(m.content()).t("[/SYSTEM_PROMPT]");
                        case "user" -> o.t("[INST]").t(space).c(m.content()).t("[/INST]");
                        default -> o.t(space).c(m.content()).t("</s>");
                    }
                }
            }
            case GEMMA -> {
                String system = null;
                for (ChatMessage m : messages) {
                    String role = role(m);
                    if (role.equals("system")) {
                        system = joinSystem(system, m.content().strip());
                        continue;
                    }
                    o.t("<start_of_turn>").t(role.equals("assistant") ? "model" : "user").t("\n");
                    if (role.equals("user") && system != null) {
                        o.c(system).t("\n\n");
                        system = null;
                    }
                    o.c(m.content().strip()).t("<end_of_turn>\n");
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

        /** Drops the blanks (Character.isWhitespace) at the end of the text from {@code from} on, as strip does. */
        Out stripTrailing(int from) {
            int end = sb.length();
            while (end > from && Character.isWhitespace(sb.charAt(end - 1))) {
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
