package dev.kvant.kv;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;

class KvFormatsDocTest {
    /** docs/KV_FORMATS.md states the signs and codebooks the code uses (regenerate with KvFormatsDoc if not). */
    @Test
    void kvFormatsDocListsTheSignsAndCodebooksTheCodeUses() throws IOException {
        Path doc = Path.of("..", "docs", "KV_FORMATS.md");
        assertTrue(Files.exists(doc), "missing " + doc.toAbsolutePath());
        String text = Files.readString(doc);
        int begin = text.indexOf(KvFormatsDoc.BEGIN);
        int end = text.indexOf(KvFormatsDoc.END);
        assertTrue(begin >= 0 && end > begin, doc + " has no generated section");
        String section = text.substring(begin, end + KvFormatsDoc.END.length()) + "\n";
        assertEquals(KvFormatsDoc.generated(), section,
                doc + " is out of date: paste the output of java dev.kvant.kv.KvFormatsDoc between its markers");
        assertTrue(text.contains("kv-format v" + KvFormat.VERSION), doc + " names the format version");
    }
}
