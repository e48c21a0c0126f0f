# Sourced by the scripts: points JAVA_HOME at a JDK 25 (JAVA_HOME if it is one, else /usr/lib/jvm/*25*).
kvant_is_jdk25() { [ -x "$1/bin/javac" ] && "$1/bin/java" -version 2>&1 | head -1 | grep -q '"25'; }
if [ -z "${JAVA_HOME:-}" ] || ! kvant_is_jdk25 "$JAVA_HOME"; then
  JAVA_HOME=""
  for d in /usr/lib/jvm/temurin-25-jdk-amd64 /usr/lib/jvm/*25*; do
    if [ -d "$d" ] && kvant_is_jdk25 "$d"; then JAVA_HOME="$d"; break; fi
  done
  if [ -z "$JAVA_HOME" ]; then
    echo "kvant needs JDK 25: set JAVA_HOME to one (none found under /usr/lib/jvm)" >&2
    exit 1
  fi
fi
export JAVA_HOME
export PATH="$JAVA_HOME/bin:$PATH"
