package dev.kvant.tokenizer;

import org.junit.jupiter.api.Test;

import java.time.LocalDate;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** Each built-in format renders a fixed conversation to the exact text of the family's published template. */
class ChatTemplateTest {

    private static final List<ChatMessage> CONVERSATION = List.of(
            ChatMessage.system("You are terse."),
            ChatMessage.user("What is 2+2?"),
            ChatMessage.assistant("4"));
    private static final List<ChatMessage> QUESTION = CONVERSATION.subList(0, 2);
    private static final String NAMES = "llama3, llama3.1, llama3.2, llama2, chatml, qwen2, qwen2.5, qwen3, qwen3-thinking,"
            + " mistral,"
            + " mistral-v1, mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken, gemma, raw";

    @Test
    void aSystemMessageNoUserMessageFollowsIsRefusedWhereTheFormatFoldsItIn() {
        for (String name : List.of("llama2", "mistral", "mistral-v3", "mistral-v3-tekken", "gemma")) {
            ChatTemplate t = ChatTemplate.named(name);
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> t.render(List.of(ChatMessage.system("be brief")), true), name);
            assertTrue(e.getMessage().contains("system message"), e.getMessage());
            t.render(QUESTION, true);   // with a user message after it: fine
        }
        // formats with a turn of its own for the system message take it alone
        for (String name : List.of("llama3", "chatml", "mistral-v7")) {
            ChatTemplate.named(name).render(List.of(ChatMessage.system("be brief")), true);
        }
    }

    /**
     * Every format marks exactly its messages' text: the ranges hold each role and content (as the format writes
     * them: stripped where it strips, system text where it puts it) and nothing of the format's own markers.
     */
    @Test
    void theMarkedRangesAreTheMessagesText() {
        List<ChatMessage> chat = List.of(ChatMessage.system(" sysA "), ChatMessage.user("userB  "),
                ChatMessage.assistant(" asstC"), ChatMessage.user("userD\n"));
        for (ChatTemplate t : ChatTemplate.builtIn()) {
            ChatTemplate.Rendered r = t.renderMarked(chat, true);
            assertEquals(t.render(chat, true), r.text(), t.templateName());
            int[] g = r.contentRanges();
            StringBuilder inside = new StringBuilder();
            StringBuilder outside = new StringBuilder();
            int at = 0;
            for (int k = 0; k < g.length; k += 2) {
                assertTrue(g[k] >= at && g[k + 1] > g[k] && g[k + 1] <= r.text().length(),
                        t.templateName() + ": ranges in order, inside the text: " + java.util.Arrays.toString(g));
                outside.append(r.text(), at, g[k]);
                inside.append(r.text(), g[k], g[k + 1]).append('|');
                at = g[k + 1];
            }
            outside.append(r.text().substring(at));
            for (String word : List.of("sysA", "userB", "asstC", "userD")) {
                assertTrue(!outside.toString().contains(word),
                        t.templateName() + ": '" + word + "' outside the ranges: " + outside);
            }
            for (String word : List.of("userB", "asstC", "userD")) {
                assertTrue(inside.toString().contains(word), t.templateName() + ": '" + word + "' in " + inside);
            }
            assertTrue(!inside.toString().contains("<|") && !inside.toString().contains("[INST]")
                    && !inside.toString().contains("<start_of_turn>"), t.templateName() + ": " + inside);
        }
    }

    @Test
    void llama3() {
        assertEquals("<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                + "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                + "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>",
                ChatTemplate.LLAMA3.render(CONVERSATION, false));
        assertTrue(ChatTemplate.LLAMA3.render(QUESTION, true)
                .endsWith("What is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"));
        // Llama 3's template trims every message.
        assertEquals("<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
                ChatTemplate.LLAMA3.render(List.of(ChatMessage.user("  hi \n")), false));
    }

    @Test
    void chatml() {
        assertEquals("<|im_start|>system\nYou are terse.<|im_end|>\n"
                + "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                + "<|im_start|>assistant\n4<|im_end|>\n",
                ChatTemplate.CHATML.render(CONVERSATION, false));
        assertEquals("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                + "<|im_start|>assistant\n", ChatTemplate.CHATML.render(QUESTION, true));
    }

    @Test
    void llama2() {
        assertEquals("[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nWhat is 2+2? [/INST] 4 </s>",
                ChatTemplate.LLAMA2.render(CONVERSATION, false));
        // Later turns open with the BOS text; the first one's BOS comes from the tokenizer.
        List<ChatMessage> twoTurns = List.of(ChatMessage.user("Hi"), ChatMessage.assistant("Hello"),
                ChatMessage.user("Bye"));
        assertEquals("[INST] Hi [/INST] Hello </s><s>[INST] Bye [/INST]", ChatTemplate.LLAMA2.render(twoTurns, true));
    }

    @Test
    void mistral() {
        assertEquals("[INST] You are terse.\n\nWhat is 2+2? [/INST]4</s>", ChatTemplate.MISTRAL.render(CONVERSATION, false));
        assertEquals("[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]", ChatTemplate.MISTRAL.render(List.of(
                ChatMessage.user("Hi"), ChatMessage.assistant("Hello"), ChatMessage.user("Bye")), true));
    }

    @Test
    void mistralV3AndTekkenPutTheSystemPromptBeforeTheLastUserMessage() {
        List<ChatMessage> twoTurns = List.of(ChatMessage.system("Be terse."), ChatMessage.user("Hi"),
                ChatMessage.assistant("Hello"), ChatMessage.user("Again"));
        assertEquals("[INST]Hi[/INST]Hello</s>[INST]Be terse.\n\nAgain[/INST]",
                ChatTemplate.MISTRAL_V3_TEKKEN.render(twoTurns, true));
        assertEquals("[INST] Hi[/INST] Hello</s>[INST] Be terse.\n\nAgain[/INST]",
                ChatTemplate.MISTRAL_V3.render(twoTurns, true));
        assertEquals("[INST] You are terse.\n\nWhat is 2+2?[/INST] 4</s>", ChatTemplate.MISTRAL_V3.render(CONVERSATION,
                false));
    }

    @Test
    void mistralV7KeepsTheSystemPromptInItsOwnBlock() {
        assertEquals("[SYSTEM_PROMPT]You are terse.[/SYSTEM_PROMPT][INST]What is 2+2?[/INST]4</s>",
                ChatTemplate.MISTRAL_V7_TEKKEN.render(CONVERSATION, false));
        assertEquals("[SYSTEM_PROMPT] You are terse.[/SYSTEM_PROMPT][INST] What is 2+2?[/INST] 4</s>",
                ChatTemplate.MISTRAL_V7.render(CONVERSATION, false));
    }

    /**
     * A SentencePiece model's answer read back as text starts with its first word's space (" Hello"); the Mistral
     * templates whose separator is that space write it once, as they write an answer without it.
     */
    @Test
    void mistralAnswersReadBackWithTheirLeadingSpaceGetOneSpace() {
        for (String answer : new String[] {"Hello", " Hello"}) {
            List<ChatMessage> chat = List.of(ChatMessage.user("Hi"), ChatMessage.assistant(answer),
                    ChatMessage.user("Bye"));
            assertEquals("[INST] Hi [/INST] Hello</s>[INST] Bye [/INST]", ChatTemplate.MISTRAL_V1.render(chat, true));
            assertEquals("[INST] Hi[/INST] Hello</s>[INST] Bye[/INST]", ChatTemplate.MISTRAL_V7.render(chat, true));
        }
    }

    /**
     * Mistral-Small-24B-Instruct-2501's chat template as published (the {@code chat_template} of its
     * tokenizer_config.json, which a GGUF conversion carries as {@code tokenizer.chat_template}).
     */
    static final String MISTRAL_SMALL_3 = "{%- set today = strftime_now(\"%Y-%m-%d\") %}\n"
            + "{%- set default_system_message = \"You are Mistral Small 3, a Large Language Model (LLM) created "
            + "by Mistral AI, a French startup headquartered in Paris.\\nYour knowledge base was last updated "
            + "on 2023-10-01. The current date is \" + today + \".\\n\\nWhen you're not sure about some "
            + "information, you say that you don't have the information and don't make up anything.\\nIf the "
            + "user's question is not clear, ambiguous, or does not provide enough context for you to "
            + "accurately answer the question, you do not try to answer it right away and you rather ask the "
            + "user to clarify their request (e.g. \\\"What are some good restaurants around me?\\\" => "
            + "\\\"Where are you?\\\" or \\\"When is the next flight to Tokyo\\\" => \\\"Where do you travel "
            + "from?\\\")\" %}\n"
            + "\n"
            + "{{- bos_token }}\n"
            + "\n"
            + "{%- if messages[0]['role'] == 'system' %}\n"
            + "    {%- set system_message = messages[0]['content'] %}\n"
            + "    {%- set loop_messages = messages[1:] %}\n"
            + "{%- else %}\n"
            + "    {%- set system_message = default_system_message %}\n"
            + "    {%- set loop_messages = messages %}\n"
            + "{%- endif %}\n"
            + "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}\n"
            + "\n"
            + "{%- for message in loop_messages %}\n"
            + "    {%- if message['role'] == 'user' %}\n"
            + "        {{- '[INST]' + message['content'] + '[/INST]' }}\n"
            + "    {%- elif message['role'] == 'system' %}\n"
            + "        {{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}\n"
            + "    {%- elif message['role'] == 'assistant' %}\n"
            + "        {{- message['content'] + eos_token }}\n"
            + "    {%- else %}\n"
            + "        {{- raise_exception('Only user, system and assistant roles are supported!') }}\n"
            + "    {%- endif %}\n"
            + "{%- endfor %}";
    /** Its default system prompt on 1 Dec 2026: jinja2 3.1.2 rendering the template with strftime_now on that day. */
    private static final String MISTRAL_SMALL_3_SYSTEM = "You are Mistral Small 3, a Large Language Model (LLM) created"
            + " by Mistral AI, a French startup headquartered in Paris.\nYour knowledge base was last updated on"
            + " 2023-10-01. The current date is 2026-12-01.\n\nWhen you're not sure about some information, you say"
            + " that you don't have the information and don't make up anything.\nIf the user's question is not clear,"
            + " ambiguous, or does not provide enough context for you to accurately answer the question, you do not try"
            + " to answer it right away and you rather ask the user to clarify their request (e.g. \"What are some good"
            + " restaurants around me?\" => \"Where are you?\" or \"When is the next flight to Tokyo\" => \"Where do"
            + " you travel from?\")";

    /**
     * Mistral Small 3's template opens a conversation whose first message is no system message with its default
     * system prompt, today's date in it; the expected texts are jinja2's rendering of the template (as transformers
     * sets it up, bos_token left out) for the same conversations on the same day.
     */
    @Test
    void mistralSmall3WritesItsTemplatesDefaultSystemPromptWhenTheConversationOpensWithoutOne() {
        ChatTemplate small3 = ChatTemplate.detect(MISTRAL_SMALL_3, null);
        assertEquals(ChatTemplate.Format.MISTRAL_V7_TEKKEN, small3.format());
        assertEquals("mistral-v7-tekken", small3.templateName());
        LocalDate day = LocalDate.of(2026, 12, 1);
        String system = "[SYSTEM_PROMPT]" + MISTRAL_SMALL_3_SYSTEM + "[/SYSTEM_PROMPT]";
        List<ChatMessage> hello = List.of(ChatMessage.user("Hello"));
        ChatTemplate.Rendered r = small3.renderMarked(hello, true, day);
        assertEquals(system + "[INST]Hello[/INST]", r.text());
        // the default is the template's own text, not a message's
        assertArrayEquals(new int[] {system.length() + 6, system.length() + 11}, r.contentRanges());
        assertEquals(system + "[INST]Hi[/INST]Hello</s>[INST]Bye[/INST]", small3.renderMarked(List.of(
                ChatMessage.user("Hi"), ChatMessage.assistant("Hello"), ChatMessage.user("Bye")), true, day).text());
        // a system message first replaces it; one later is a block where it stands, after the default
        assertEquals("[SYSTEM_PROMPT]You are terse.[/SYSTEM_PROMPT][INST]What is 2+2?[/INST]4</s>",
                small3.renderMarked(CONVERSATION, false, day).text());
        assertEquals(system + "[INST]Hi[/INST][SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Bye[/INST]",
                small3.renderMarked(List.of(ChatMessage.user("Hi"), ChatMessage.system("Be brief."),
                        ChatMessage.user("Bye")), true, day).text());
        assertTrue(small3.render(hello, true).matches("(?s).*The current date is \\d{4}-\\d\\d-\\d\\d\\.\n.*"),
                small3.render(hello, true));

        // the format by name has no template to take a default from, and a v7 Tekken template without one writes none
        assertEquals("[INST]Hello[/INST]", ChatTemplate.named("mistral-v7-tekken").render(hello, true));
        assertSame(ChatTemplate.MISTRAL_V7_TEKKEN, ChatTemplate.detect("{{- '[SYSTEM_PROMPT]' + system_message"
                + " + '[/SYSTEM_PROMPT]' }}{{- '[INST]' + message['content'] + '[/INST]' }}", null));
    }

    /** A default system prompt kvant cannot read (here one that runs through a filter) is left out, the format kept. */
    @Test
    void aDefaultSystemPromptKvantCannotReadIsLeftOut() {
        String filtered = MISTRAL_SMALL_3.replace("\" + today + \"", "\" + today | upper + \"");
        assertTrue(!filtered.equals(MISTRAL_SMALL_3));
        ChatTemplate t = ChatTemplate.detect(filtered, null);
        assertSame(ChatTemplate.MISTRAL_V7_TEKKEN, t);
        assertEquals("[INST]Hello[/INST]", t.render(List.of(ChatMessage.user("Hello")), true));
    }

    @Test
    void gemma() {
        assertEquals("<start_of_turn>user\nYou are terse.\n\nWhat is 2+2?<end_of_turn>\n"
                + "<start_of_turn>model\n4<end_of_turn>\n",
                ChatTemplate.GEMMA.render(CONVERSATION, false));
        assertTrue(ChatTemplate.GEMMA.render(QUESTION, true).endsWith("<end_of_turn>\n<start_of_turn>model\n"));
    }

    @Test
    void severalSystemMessagesAreAllKeptWhereTheyFoldIntoTheUserTurn() {
        List<ChatMessage> two = List.of(new ChatMessage("system", "A"), new ChatMessage("system", "B"),
                new ChatMessage("user", "hi"));
        assertEquals("<start_of_turn>user\nA\n\nB\n\nhi<end_of_turn>\n", ChatTemplate.GEMMA.render(two, false));
        assertTrue(ChatTemplate.MISTRAL.render(two, false).startsWith("[INST] A\n\nB\n\nhi"),
                ChatTemplate.MISTRAL.render(two, false));
        assertTrue(ChatTemplate.LLAMA2.render(two, false).contains("<<SYS>>\nA\n\nB\n<</SYS>>"),
                ChatTemplate.LLAMA2.render(two, false));
    }

    @Test
    void raw() {
        assertEquals("You are terse.What is 2+2?4", ChatTemplate.RAW.render(CONVERSATION, false));
        assertEquals("You are terse.What is 2+2?", ChatTemplate.RAW.render(QUESTION, true));
    }

    @Test
    void formatsAreRecognisedByTheirMarkers() {
        assertEquals(ChatTemplate.LLAMA3, ChatTemplate.detect("{% set content = '<|start_header_id|>' + message['role']"
                + " + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}", null));
        assertEquals(ChatTemplate.CHATML, ChatTemplate.detect("{% for message in messages %}{{'<|im_start|>' + "
                + "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}", null));
        assertEquals(ChatTemplate.GEMMA, ChatTemplate.detect("{{ '<start_of_turn>' + role + '\\n' + message['content']"
                + " | trim + '<end_of_turn>\\n' }}", null));
        assertEquals(ChatTemplate.LLAMA2, ChatTemplate.detect("{% set content = '<<SYS>>\\n' + system_message + "
                + "'\\n<</SYS>>\\n\\n' + message['content'] %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}",
                null));
        assertEquals(ChatTemplate.MISTRAL, ChatTemplate.detect("{{ bos_token }}{% for message in messages %}"
                + "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endfor %}", null));
        // Mistral's own templates (shortened): v1 has " [INST] ", v3 "[INST] ", v3 Tekken "[INST]", v7 a system block
        assertEquals(ChatTemplate.MISTRAL_V1, ChatTemplate.detect("{%- if tools %}[AVAILABLE_TOOLS]{%- endif %}"
                + "{{- ' [INST] ' + message['content'] + ' [/INST]' }}", null));
        assertEquals(ChatTemplate.MISTRAL_V3, ChatTemplate.detect("{%- if tools %}[AVAILABLE_TOOLS]{%- endif %}"
                + "{{- '[INST] ' + message['content'] + '[/INST]' }}", null));
        assertEquals(ChatTemplate.MISTRAL_V3_TEKKEN, ChatTemplate.detect("{%- if tools %}[AVAILABLE_TOOLS]{%- endif %}"
                + "{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}", null));
        assertEquals(ChatTemplate.MISTRAL_V7_TEKKEN, ChatTemplate.detect("{{- '[SYSTEM_PROMPT]' + system_message"
                + " + '[/SYSTEM_PROMPT]' }}{{- '[INST]' + message['content'] + '[/INST]' }}", null));
        assertEquals(ChatTemplate.MISTRAL_V7, ChatTemplate.detect("{{- '[SYSTEM_PROMPT] ' + message['content']"
                + " + '[/SYSTEM_PROMPT]' }}{{- '[INST] ' + message['content'] + '[/INST]' }}", null));
        assertEquals(ChatTemplate.RAW, ChatTemplate.detect(null, null));
    }

    /**
     * Against Hugging Face's apply_chat_template of the real templates (rendered with jinja2 as transformers sets it
     * up): the Qwen2/2.5 default system prompt, Llama 3.1's system block, Qwen3's reasoning, Mistral v1's answer
     * spacing, Python's blanks in trim, Gemma 3's system text as given.
     */
    @Test
    void familiesRenderAsTheirPublishedTemplates() {
        List<ChatMessage> hello = List.of(ChatMessage.user("Hello"));
        assertEquals(ChatTemplate.QWEN25, ChatTemplate.detect("{%- else %}{{- '<|im_start|>system\\nYou are Qwen, "
                + "created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}", null));
        assertEquals("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                + "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", ChatTemplate.QWEN25.render(hello, true));
        assertEquals(ChatTemplate.QWEN2, ChatTemplate.detect("{% if loop.first and messages[0]['role'] != 'system' %}"
                + "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}", null));
        assertEquals("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n",
                ChatTemplate.QWEN2.render(hello, false));
        // a system message of its own replaces the default
        assertEquals("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n",
                ChatTemplate.QWEN25.render(List.of(ChatMessage.system("Be brief."), hello.get(0)), false));

        assertEquals(ChatTemplate.LLAMA31, ChatTemplate.detect("{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
                + "{{- \"Cutting Knowledge Date: December 2023\\n\" }}", null));
        assertEquals(ChatTemplate.LLAMA32, ChatTemplate.detect("{%- if strftime_now is defined %}{{- '<|start_header_id|>"
                + "system<|end_header_id|>' }}{{- \"Cutting Knowledge Date: December 2023\\n\" }}", null));
        String block = "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                + "Today Date: 26 Jul 2024\n\n";
        assertEquals(block + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                + "<|start_header_id|>assistant<|end_header_id|>\n\n", ChatTemplate.LLAMA31.render(hello, true));
        assertEquals(block + "You are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>",
                ChatTemplate.LLAMA31.render(QUESTION, false));
        assertTrue(ChatTemplate.LLAMA32.render(hello, false).matches("(?s).*Today Date: \\d\\d [A-Z][a-z]{2} \\d{4}\n\n.*"),
                ChatTemplate.LLAMA32.render(hello, false));

        assertEquals(ChatTemplate.QWEN3, ChatTemplate.detect("{{- '<|im_start|>' + message.role + '\\n<think>\\n' + "
                + "reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}", null));
        // QwQ, Qwen3-*-Thinking-2507: the generation prompt opens the reasoning
        ChatTemplate thinking = ChatTemplate.detect("{%- set content = message.content.split('</think>')[-1] %}"
                + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}", null);
        assertEquals(ChatTemplate.QWEN3_THINKING, thinking);
        assertEquals("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                        + "<|im_start|>user\nAnd?<|im_end|>\n<|im_start|>assistant\n<think>\n",
                thinking.render(List.of(ChatMessage.user("Hi"), ChatMessage.assistant("<think>\nhmm\n</think>\n\nHello!"),
                        ChatMessage.user("And?")), true));
        assertEquals("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                        + "<|im_start|>user\nAnd?<|im_end|>\n<|im_start|>assistant\n",
                ChatTemplate.QWEN3.render(List.of(ChatMessage.user("Hi"),
                        ChatMessage.assistant("<think>\nhmm\n</think>\n\nHello!"), ChatMessage.user("And?")), true));
        // an answer after the last user message keeps its reasoning in a think block (an empty one when last)
        assertEquals("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello!<|im_end|>\n",
                ChatTemplate.QWEN3.render(List.of(ChatMessage.user("Hi"),
                        ChatMessage.assistant("<think>\n\nhmm\n</think>\n\nHello!")), false));
        assertEquals("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n",
                ChatTemplate.QWEN3.render(List.of(ChatMessage.user("Hi"), ChatMessage.assistant("Hello!")), false));

        assertEquals("[INST] Be brief.\n\nHi [/INST] Hello!</s>[INST] Bye [/INST]",
                ChatTemplate.MISTRAL_V1.render(List.of(ChatMessage.system("Be brief."), ChatMessage.user("Hi"),
                        ChatMessage.assistant("Hello!"), ChatMessage.user("Bye")), true));

        assertEquals("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
                ChatTemplate.LLAMA3.render(List.of(ChatMessage.user("\u00a0Hi\u202f")), false));
        assertEquals("<start_of_turn>user\n  Be brief. \n\n\nHi<end_of_turn>\n<start_of_turn>model\n",
                ChatTemplate.GEMMA.render(List.of(ChatMessage.system("  Be brief. \n"), ChatMessage.user("Hi")), true));
        // Llama 2: a conversation opening with an answer still opens the next turn with <s>
        assertEquals("[INST] a [/INST] b </s><s>[INST] c [/INST]", ChatTemplate.LLAMA2.render(List.of(
                ChatMessage.user("a"), ChatMessage.assistant("b"), ChatMessage.user("c")), true));
        assertEquals(" b </s><s>[INST] c [/INST]", ChatTemplate.LLAMA2.render(List.of(
                ChatMessage.assistant("b"), ChatMessage.user("c")), true));
    }

    @Test
    void aNameOverridesTheModelsTemplate() {
        assertEquals(ChatTemplate.CHATML, ChatTemplate.detect("<|start_header_id|>", "chatml"));
        assertEquals(ChatTemplate.RAW, ChatTemplate.detect("<|im_start|>", "raw"));
    }

    @Test
    void unknownNamesAndTemplatesAreRejectedWithTheListOfNames() {
        IllegalArgumentException byName = assertThrows(IllegalArgumentException.class,
                () -> ChatTemplate.detect(null, "vicuna"));
        assertTrue(byName.getMessage().contains("'vicuna'")
                && byName.getMessage().contains(NAMES), byName.getMessage());
        IllegalArgumentException byText = assertThrows(IllegalArgumentException.class,
                () -> ChatTemplate.detect("{{ 'USER: ' + message['content'] }}", null));
        assertTrue(byText.getMessage().contains("tokenizer.chat_template")
                && byText.getMessage().contains(NAMES), byText.getMessage());
    }

    @Test
    void formatsWithFixedRolesRejectOthers() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> ChatTemplate.GEMMA.render(List.of(new ChatMessage("tool", "x")), true));
        assertTrue(e.getMessage().contains("'tool'"), e.getMessage());
        assertEquals("<|im_start|>tool\nx<|im_end|>\n",
                ChatTemplate.CHATML.render(List.of(new ChatMessage("tool", "x")), false));
    }

    @Test
    void renderedChatmlEncodesItsMarkersAsControlTokens() {
        Tokenizer tok = Tokenizer.create(SyntheticVocab.bpe("qwen2"));
        String prompt = ChatTemplate.CHATML.render(List.of(ChatMessage.user("hello")), true);
        int[] ids = tok.encode(prompt, true, true);
        assertEquals(SyntheticVocab.IM_START, ids[0]);
        assertEquals(2, java.util.Arrays.stream(ids).filter(id -> id == SyntheticVocab.IM_START).count());
        assertEquals(1, java.util.Arrays.stream(ids).filter(id -> id == SyntheticVocab.IM_END).count());
        assertEquals(prompt, tok.decode(ids));
    }
}
